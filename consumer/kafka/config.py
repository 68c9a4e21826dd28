"""Kafka client options from `KafkaSettings`: the one place where every client of the service (the input
consumer, the producer, the transactional producers, admin clients, the CLI tools) gets its connection,
TLS and SASL options.

Secrets (`SecretStr` settings or `*_file` paths) are unwrapped here only, once per settings object: the
options are built on first use and reused, so every client shares one `ssl.SSLContext` and one OAUTHBEARER
token provider, and secret files are read once (rotating a secret needs a restart).
"""

from __future__ import annotations

import functools
import importlib
import ssl
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from consumer.kafka.settings import KafkaSecuritySettings, KafkaSettings

_SSL_PROTOCOLS = ("SSL", "SASL_SSL")
_SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")


class KafkaConfigError(ValueError):
    """The security settings are incomplete or inconsistent, or a file they name cannot be used."""


def client_options(settings: KafkaSettings) -> dict[str, Any]:
    """Keyword arguments shared by `AIOKafkaConsumer`, `AIOKafkaProducer` and `AIOKafkaAdminClient`.

    Blocking on first call for a settings object (reads certificate and secret files); cheap afterwards.
    Returns a fresh dict each call (values shared). Raises `KafkaConfigError`.
    """
    return dict(_options(settings))


@functools.lru_cache(maxsize=16)
def _options(settings: KafkaSettings) -> dict[str, Any]:
    sec = settings.security
    _check(sec)
    opts: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "client_id": settings.client_id,
        "security_protocol": sec.protocol,
    }
    if sec.protocol in _SASL_PROTOCOLS:
        assert sec.sasl_mechanism is not None  # checked above
        opts["sasl_mechanism"] = sec.sasl_mechanism
        if sec.sasl_mechanism == "OAUTHBEARER":
            assert sec.oauth_token_provider is not None
            opts["sasl_oauth_token_provider"] = load_token_provider(sec.oauth_token_provider)
        else:
            opts["sasl_plain_username"] = sec.sasl_username
            opts["sasl_plain_password"] = read_secret(
                sec.sasl_password, sec.sasl_password_file, "sasl_password"
            )
    if sec.protocol in _SSL_PROTOCOLS:
        opts["ssl_context"] = ssl_context(sec)
    return opts


def _check(sec: KafkaSecuritySettings) -> None:
    """Reject settings that cannot work, naming the setting (before any connection is tried)."""
    name = "kafka.security"
    if sec.protocol in _SASL_PROTOCOLS:
        if sec.sasl_mechanism is None:
            raise KafkaConfigError(f"{name}.protocol={sec.protocol} needs {name}.sasl_mechanism")
        if sec.sasl_mechanism == "OAUTHBEARER":
            if not sec.oauth_token_provider:
                raise KafkaConfigError(f"sasl_mechanism OAUTHBEARER needs {name}.oauth_token_provider")
        elif not sec.sasl_username or (sec.sasl_password is None and sec.sasl_password_file is None):
            raise KafkaConfigError(
                f"sasl_mechanism {sec.sasl_mechanism} needs {name}.sasl_username and "
                f"{name}.sasl_password (or sasl_password_file)"
            )
    elif sec.sasl_mechanism is not None:
        raise KafkaConfigError(
            f"{name}.sasl_mechanism is set but protocol is {sec.protocol} (use SASL_SSL or SASL_PLAINTEXT)"
        )
    ssl_set = [f for f in ("ssl_cafile", "ssl_certfile", "ssl_keyfile") if getattr(sec, f) is not None]
    if ssl_set and sec.protocol not in _SSL_PROTOCOLS:
        raise KafkaConfigError(
            f"{name}.{ssl_set[0]} is set but protocol is {sec.protocol} (use SSL or SASL_SSL)"
        )
    if sec.ssl_keyfile is not None and sec.ssl_certfile is None:
        raise KafkaConfigError(f"{name}.ssl_keyfile needs {name}.ssl_certfile")


def read_secret(inline: SecretStr | None, file: Path | None, name: str) -> str | None:
    """The secret given inline or in `file` (stripped of surrounding whitespace); None when neither.

    Raises `KafkaConfigError` when both are given, or the file is unreadable or empty.
    """
    if inline is not None and file is not None:
        raise KafkaConfigError(f"kafka.security.{name} and {name}_file are both set; keep one")
    if inline is not None:
        return inline.get_secret_value()
    if file is None:
        return None
    try:
        text = file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise KafkaConfigError(f"cannot read kafka.security.{name}_file {file}: {exc}") from None
    if not text:
        raise KafkaConfigError(f"kafka.security.{name}_file {file} is empty")
    return text


def ssl_context(sec: KafkaSecuritySettings) -> ssl.SSLContext:
    """A client TLS context: verifies the broker against `ssl_cafile` (or the system CAs), checks its host
    name unless `ssl_check_hostname` is off, and presents `ssl_certfile`/`ssl_keyfile` when set (mTLS).

    Raises `KafkaConfigError` naming the file when a CA, certificate or key cannot be loaded (including a
    wrong key password).
    """
    try:
        ctx = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=str(sec.ssl_cafile) if sec.ssl_cafile else None
        )
    except (OSError, ssl.SSLError) as exc:
        raise KafkaConfigError(f"cannot load kafka.security.ssl_cafile {sec.ssl_cafile}: {exc}") from None
    # Hostname checking off still verifies the chain (verify_mode stays CERT_REQUIRED).
    ctx.check_hostname = sec.ssl_check_hostname
    if sec.ssl_certfile is not None:
        password = read_secret(sec.ssl_key_password, sec.ssl_key_password_file, "ssl_key_password")
        try:
            ctx.load_cert_chain(
                str(sec.ssl_certfile),
                str(sec.ssl_keyfile) if sec.ssl_keyfile else None,
                password=password,
            )
        except (OSError, ssl.SSLError) as exc:
            raise KafkaConfigError(
                f"cannot load the client certificate {sec.ssl_certfile} / key {sec.ssl_keyfile} "
                f"(wrong ssl_key_password?): {exc}"
            ) from None
    return ctx


def load_token_provider(spec: str) -> Any:
    """Import `module:attribute` and call it with no arguments; the result must be an aiokafka
    `AbstractTokenProvider` (its async `token()` is asked for a token on every connection).

    Raises `KafkaConfigError` when the name does not resolve or the result is not a token provider.
    """
    from aiokafka.abc import AbstractTokenProvider

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise KafkaConfigError(
            f"kafka.security.oauth_token_provider must be 'module:attribute', got {spec!r}"
        )
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise KafkaConfigError(f"cannot load oauth_token_provider {spec!r}: {exc}") from None
    provider = factory()
    if not isinstance(provider, AbstractTokenProvider):
        raise KafkaConfigError(
            f"oauth_token_provider {spec!r} returned {type(provider).__name__}, not an AbstractTokenProvider"
        )
    return provider
