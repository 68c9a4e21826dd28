"""Kafka client options from the security settings (no broker): what each protocol needs, secrets from
files, TLS contexts, the token provider hook, masking, and connection-failure messages."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest
from aiokafka.abc import AbstractTokenProvider
from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed

from consumer.kafka.access import describe_connect_error, output_topics, service_topics
from consumer.kafka.config import KafkaConfigError, client_options
from consumer.kafka.protocol import AclOperation, TopicAccess
from consumer.settings import KafkaSettings, TopicSettings, load_settings
from tests.support.certs import TestCA


class StaticToken(AbstractTokenProvider):  # type: ignore[misc]
    async def token(self) -> str:
        return "t0ken"


def make_provider() -> StaticToken:
    return StaticToken()


def not_a_provider() -> object:
    return object()


def kafka(**security: Any) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers="127.0.0.1:9", security=security)


def test_plaintext_default_has_no_security_options() -> None:
    opts = client_options(KafkaSettings())
    assert opts["security_protocol"] == "PLAINTEXT"
    assert "ssl_context" not in opts
    assert "sasl_mechanism" not in opts


def test_scram_password_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("  from-file\n")
    opts = client_options(
        kafka(
            protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="u",
            sasl_password_file=secret,
        )
    )
    assert opts["sasl_mechanism"] == "SCRAM-SHA-512"
    assert opts["sasl_plain_username"] == "u"
    assert opts["sasl_plain_password"] == "from-file"


@pytest.mark.parametrize(
    ("security", "message"),
    [
        ({"protocol": "SASL_SSL"}, "needs kafka.security.sasl_mechanism"),
        ({"protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u"}, "sasl_password"),
        ({"protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"}, "oauth_token_provider"),
        ({"sasl_mechanism": "PLAIN"}, "protocol is PLAINTEXT"),
        ({"ssl_cafile": "/x.pem"}, "use SSL or SASL_SSL"),
        ({"protocol": "SSL", "ssl_keyfile": "/k.pem"}, "ssl_keyfile needs"),
        (
            {
                "protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "sasl_username": "u",
                "sasl_password": "a",
                "sasl_password_file": "/p",
            },
            "both set",
        ),
        (
            {
                "protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "sasl_username": "u",
                "sasl_password_file": "/does/not/exist",
            },
            "cannot read",
        ),
        ({"protocol": "SSL", "ssl_cafile": "/does/not/exist.pem"}, "cannot load kafka.security.ssl_cafile"),
    ],
)
def test_unusable_settings_are_named(security: dict[str, Any], message: str) -> None:
    with pytest.raises(KafkaConfigError, match=message):
        client_options(kafka(**security))


def test_tls_context_verifies_and_loads_an_encrypted_client_key(tmp_path: Path) -> None:
    ca = TestCA(tmp_path)
    client = ca.issue("svc", key_password="kp")
    pw_file = tmp_path / "kp"
    pw_file.write_text("kp")
    sec = {
        "protocol": "SSL",
        "ssl_cafile": ca.cert_file,
        "ssl_certfile": client.cert,
        "ssl_keyfile": client.key,
    }
    ctx = client_options(kafka(**sec, ssl_key_password_file=pw_file))["ssl_context"]
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.check_hostname
    off = client_options(kafka(**sec, ssl_key_password="kp", ssl_check_hostname=False))["ssl_context"]
    assert not off.check_hostname
    assert off.verify_mode == ssl.CERT_REQUIRED  # the chain is still verified
    with pytest.raises(KafkaConfigError, match="wrong ssl_key_password"):
        client_options(kafka(**sec, ssl_key_password="nope"))


def test_clients_share_one_context_per_settings(tmp_path: Path) -> None:
    ca = TestCA(tmp_path)
    settings = kafka(protocol="SSL", ssl_cafile=ca.cert_file)
    first, second = client_options(settings), client_options(settings)
    assert first is not second
    assert first["ssl_context"] is second["ssl_context"]


def test_oauthbearer_token_provider_hook() -> None:
    sec = {"protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"}
    opts = client_options(kafka(**sec, oauth_token_provider=f"{__name__}:make_provider"))
    assert isinstance(opts["sasl_oauth_token_provider"], StaticToken)
    assert asyncio.run(opts["sasl_oauth_token_provider"].token()) == "t0ken"
    with pytest.raises(KafkaConfigError, match="not an AbstractTokenProvider"):
        client_options(kafka(**sec, oauth_token_provider=f"{__name__}:not_a_provider"))
    with pytest.raises(KafkaConfigError, match="cannot load"):
        client_options(kafka(**sec, oauth_token_provider=f"{__name__}:missing"))
    with pytest.raises(KafkaConfigError, match="module:attribute"):
        client_options(kafka(**sec, oauth_token_provider="no-colon"))


def test_secrets_are_masked_and_env_names_nest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEF_KAFKA__SECURITY__SSL_KEY_PASSWORD", "key-secret")
    monkeypatch.setenv("CLEF_KAFKA__SECURITY__SASL_PASSWORD", "sasl-secret")
    monkeypatch.setenv("CLEF_KAFKA__SECURITY__PROTOCOL", "SASL_SSL")
    s = load_settings()
    assert s.kafka.security.protocol == "SASL_SSL"
    dumped = repr(s.masked())
    assert "key-secret" not in dumped
    assert "sasl-secret" not in dumped
    monkeypatch.setenv("CLEF_KAFKA__SECURITY__SASL_PASWORD", "typo")
    with pytest.raises(ValueError, match="unknown setting"):
        load_settings()


def test_connect_errors_become_one_telling_line() -> None:
    s = kafka(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256", sasl_username="svc", sasl_password="x")
    rank, line = describe_connect_error(SaslAuthenticationFailed("invalid credentials"), s, "h:1")
    assert "SASL authentication failed" in line
    assert "'svc'" in line
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    verify.verify_message = "unable to get local issuer certificate"
    assert "not trusted" in describe_connect_error(verify, s, "h:1")[1]
    refused = KafkaConnectionError("closed")
    refused.__cause__ = ConnectionRefusedError(111, "Connection refused")
    low, other = describe_connect_error(refused, s, "h:1")
    assert low < rank
    assert other.startswith("cannot connect to Kafka at h:1")
    for text in (line, other):
        assert "\n" not in text


def test_topic_lists_and_authorized_operation_bits() -> None:
    topics = TopicSettings(input=("a", "b"), dlq="d")
    outs = output_topics(topics, ["x", "x", "y"])
    assert outs == ["decisions", "route.review", "route.unrouted", "d", "route.x", "route.y"]
    assert service_topics(topics, ["x"])[:2] == ["a", "b"]
    write_only = TopicAccess("t", 0, 1 << AclOperation.WRITE | 1 << AclOperation.DESCRIBE)
    assert write_only.allows(AclOperation.WRITE)
    assert not write_only.allows(AclOperation.READ)
    assert not TopicAccess("t", 0, -(2**31)).allows(AclOperation.WRITE)  # not reported: not allowed
