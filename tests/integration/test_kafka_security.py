"""The service against a broker that requires TLS, SASL SCRAM or client certificates and enforces ACLs
(issue 18): events routed end to end over SASL_SSL and over mTLS; a wrong password or an untrusted
certificate fails at start with one line; exactly the documented ACLs suffice, and a missing WRITE on the
DLQ or a route topic, or a missing CREATE, stops the service at start naming the topic and operation.

One secured broker for the module (`tests/support/secure_kafka.py`); each test has its own topics, group
and, for the ACL cases, its own client-certificate principal. The harness reads and writes through the
broker's super-user PLAINTEXT listener.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from consumer.kafka.access import KafkaAccessError, MissingTopicsError
from consumer.pipeline.pipeline import Pipeline
from consumer.settings import Settings, load_settings
from devtools.stub import StubEngine
from tests.support.acls import Acl, grant
from tests.support.certs import TestCA
from tests.support.flow import produce_events, tally_decisions, wait_committed
from tests.support.secure_kafka import SecureKafka, start_secure_kafka

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PASSWORD = "s3cret-pw-for-scram"
EVENTS = 300


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    broker = start_secure_kafka(tmp_path_factory.mktemp("tls"), {"svc": PASSWORD})
    try:
        yield broker
    finally:
        broker.stop()


def _settings(prefix: str, bootstrap: str, security: dict[str, Any], **kafka: Any) -> Settings:
    return load_settings(
        kafka={
            "bootstrap_servers": bootstrap,
            "group_id": f"{prefix}.g",
            "commit_interval_ms": 100,
            "security": security,
            **kafka,
        },
        topics={
            "input": [f"{prefix}.in"],
            "decisions": f"{prefix}.decisions",
            "route_prefix": f"{prefix}.route.",
            "review": f"{prefix}.route.review",
            "unrouted": f"{prefix}.route.unrouted",
            "dlq": f"{prefix}.dlq",
        },
        batching={"max_batch_records": 32, "max_wait_ms": 5},
        http={"enabled": False},
    )


def _outputs(s: Settings) -> list[str]:
    t = s.topics
    routes = [t.route_prefix + v for v in s.routing.department_map.values()]
    return [t.decisions, t.review, t.unrouted, t.dlq, *routes]


def _exact_acls(
    principal: str, s: Settings, *, skip_write: str | None = None, group: bool = True
) -> list[Acl]:
    """The ACLs the README lists for at-least-once mode, literal names (minus WRITE on `skip_write`, and
    READ on the group unless `group`)."""
    acls = [Acl(principal, "topic", t, "read") for t in s.topics.input]
    if group:
        acls.append(Acl(principal, "group", s.kafka.group_id, "read"))
    acls += [Acl(principal, "topic", t, "write") for t in _outputs(s) if t != skip_write]
    return acls


def _prefix_acls(principal: str, prefix: str) -> list[Acl]:
    """Everything under `prefix`: topics (read, write, create), the group and the transactional ids."""
    ops = [("topic", "read"), ("topic", "write"), ("topic", "create"), ("group", "read")]
    ops += [("transactional_id", "write"), ("transactional_id", "describe")]
    return [Acl(principal, kind, prefix, op, pattern="prefixed") for kind, op in ops]


async def _route_events(secure: SecureKafka, settings: Settings) -> None:
    """Send EVENTS to the input, run the service until all are committed, check one decision each."""
    topic = settings.topics.input[0]
    await asyncio.to_thread(secure.broker.create_topics, [topic], partitions=3)
    await produce_events(secure.admin, topic, 0, EVENTS)
    pipeline = Pipeline(settings, StubEngine(settings.batching.limits))
    task = asyncio.create_task(pipeline.run())
    try:
        done = await wait_committed(
            secure.admin, settings.kafka.group_id, topic, EVENTS, timeout_s=120, alive=task
        )
        assert done == EVENTS
    finally:
        pipeline.request_stop()
        await asyncio.wait_for(task, 60)
    tally = await tally_decisions(
        secure.admin, settings.topics.decisions, EVENTS, read_committed=settings.kafka.exactly_once
    )
    print(f"\n{settings.kafka.security.protocol}: {tally}")
    assert tally.lost == 0
    if settings.kafka.exactly_once:
        assert tally.duplicates == 0


async def test_sasl_ssl_scram_routes_events_end_to_end(secure: SecureKafka, tmp_path: Path) -> None:
    prefix = f"scram-{uuid.uuid4().hex[:6]}"
    password_file = tmp_path / "kafka-password"
    password_file.write_text(PASSWORD + "\n")  # from a file (a mounted secret), trailing newline and all
    security = {
        "protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "svc",
        "sasl_password_file": str(password_file),
        "ssl_cafile": str(secure.ca.cert_file),
    }
    await grant(secure.admin, _prefix_acls("User:svc", prefix))
    await _route_events(secure, _settings(prefix, secure.sasl_ssl, security))


async def test_mtls_routes_events_end_to_end_exactly_once(secure: SecureKafka) -> None:
    prefix = f"mtls-{uuid.uuid4().hex[:6]}"
    client = secure.ca.issue(prefix, key_password="key-pw")  # encrypted key: the password is used too
    security = {
        "protocol": "SSL",
        "ssl_cafile": str(secure.ca.cert_file),
        "ssl_certfile": str(client.cert),
        "ssl_keyfile": str(client.key),
        "ssl_key_password": "key-pw",
    }
    await grant(secure.admin, _prefix_acls(f"User:{prefix}", prefix))
    await _route_events(secure, _settings(prefix, secure.mtls, security, exactly_once=True))


@pytest.mark.parametrize("mechanism", ["PLAIN", "OAUTHBEARER"])
async def test_sasl_plaintext_plain_and_oauthbearer_route_events(secure: SecureKafka, mechanism: str) -> None:
    from tests.support.oauth import SUBJECT

    prefix = f"{mechanism.lower()}-{uuid.uuid4().hex[:6]}"
    security: dict[str, Any] = {"protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism}
    if mechanism == "PLAIN":
        security |= {"sasl_username": "svc", "sasl_password": PASSWORD}
        principal = "User:svc"
    else:  # the token provider hook: a 'module:attribute' the service imports and calls
        security |= {"oauth_token_provider": "tests.support.oauth:provider"}
        principal = f"User:{SUBJECT}"
    await grant(secure.admin, _prefix_acls(principal, prefix))
    await _route_events(secure, _settings(prefix, secure.sasl_plaintext, security))


def test_wrong_password_fails_at_start_with_one_line(secure: SecureKafka) -> None:
    """`clef-router run` as a user would start it: exits 1 at once, one error line, no retry loop."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CLEF_")},
        "CLEF_KAFKA__BOOTSTRAP_SERVERS": secure.sasl_ssl,
        "CLEF_KAFKA__SECURITY__PROTOCOL": "SASL_SSL",
        "CLEF_KAFKA__SECURITY__SASL_MECHANISM": "SCRAM-SHA-256",
        "CLEF_KAFKA__SECURITY__SASL_USERNAME": "svc",
        "CLEF_KAFKA__SECURITY__SASL_PASSWORD": "not-the-password",
        "CLEF_KAFKA__SECURITY__SSL_CAFILE": str(secure.ca.cert_file),
        "CLEF_HTTP__ENABLED": "false",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "consumer.cli", "run", "--stub-engine"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    print("\n" + "\n".join(errors))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert len(errors) == 1
    assert "SASL authentication failed" in errors[0]
    assert "'svc'" in errors[0]
    assert "not-the-password" not in proc.stderr  # the secret is masked in the settings log line
    assert "Unable connect" not in proc.stderr  # no aiokafka connect-and-retry noise


@pytest.mark.parametrize("case", ["untrusted-broker", "untrusted-client"])
async def test_untrusted_certificate_fails_at_start(secure: SecureKafka, tmp_path: Path, case: str) -> None:
    prefix = f"cert-{uuid.uuid4().hex[:6]}"
    rogue = TestCA(tmp_path / "rogue", "rogue-ca")
    if case == "untrusted-broker":  # the client trusts another CA than the broker's
        bootstrap = secure.sasl_ssl
        security: dict[str, Any] = {
            "protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_username": "svc",
            "sasl_password": PASSWORD,
            "ssl_cafile": str(rogue.cert_file),
        }
        expected = "broker certificate"
    else:  # the broker does not trust the client's certificate
        client = rogue.issue(prefix)
        bootstrap = secure.mtls
        security = {
            "protocol": "SSL",
            "ssl_cafile": str(secure.ca.cert_file),
            "ssl_certfile": str(client.cert),
            "ssl_keyfile": str(client.key),
        }
        expected = "client certificate"
    pipeline = Pipeline(_settings(prefix, bootstrap, security), StubEngine())
    with pytest.raises(KafkaAccessError, match=expected) as info:
        await asyncio.wait_for(pipeline.run(), 60)
    print(f"\n{case}: {info.value}")
    assert "\n" not in str(info.value)


async def test_exactly_the_documented_acls_suffice(secure: SecureKafka) -> None:
    prefix = f"acl-{uuid.uuid4().hex[:6]}"
    client = secure.ca.issue(prefix)
    settings = _settings(prefix, secure.mtls, _mtls(secure, client), create_topics=False)
    await asyncio.to_thread(secure.broker.create_topics, _outputs(settings), partitions=1)
    await grant(secure.admin, _exact_acls(f"User:{prefix}", settings))
    await _route_events(secure, settings)


@pytest.mark.parametrize("missing", ["dlq", "route"])
async def test_missing_write_acl_stops_at_start_naming_topic(secure: SecureKafka, missing: str) -> None:
    prefix = f"noacl-{uuid.uuid4().hex[:6]}"
    client = secure.ca.issue(prefix)
    settings = _settings(prefix, secure.mtls, _mtls(secure, client), create_topics=False)
    denied = settings.topics.dlq if missing == "dlq" else f"{prefix}.route.storage"
    await asyncio.to_thread(
        secure.broker.create_topics, [*settings.topics.input, *_outputs(settings)], partitions=1
    )
    acls = _exact_acls(f"User:{prefix}", settings, skip_write=denied)
    if missing == "route":  # the route topic is visible (DESCRIBE) but not writable
        acls.append(Acl(f"User:{prefix}", "topic", denied, "describe"))
    await grant(secure.admin, acls)
    pipeline = Pipeline(settings, StubEngine())
    with pytest.raises(KafkaAccessError) as info:
        await asyncio.wait_for(pipeline.run(), 60)
    print(f"\nmissing WRITE on {missing}: {info.value}")
    named = f"DESCRIBE and WRITE on topic {denied!r}" if missing == "dlq" else f"; WRITE on topic {denied!r}"
    assert named in f"; {info.value}".replace("denies this connection's principal ", "; ")
    assert str(info.value).count("WRITE on topic") == 1  # exactly the missing one is named


async def test_missing_group_acl_stops_at_start(secure: SecureKafka) -> None:
    prefix = f"nogroup-{uuid.uuid4().hex[:6]}"
    client = secure.ca.issue(prefix)
    settings = _settings(prefix, secure.mtls, _mtls(secure, client), create_topics=False)
    await asyncio.to_thread(
        secure.broker.create_topics, [*settings.topics.input, *_outputs(settings)], partitions=1
    )
    await grant(secure.admin, _exact_acls(f"User:{prefix}", settings, group=False))
    pipeline = Pipeline(settings, StubEngine())
    with pytest.raises(KafkaAccessError, match=f"READ on group '{prefix}.g'") as info:
        await asyncio.wait_for(pipeline.run(), 60)
    print(f"\nno group ACL: {info.value}")


async def test_missing_create_permission_stops_at_start(secure: SecureKafka) -> None:
    prefix = f"nocreate-{uuid.uuid4().hex[:6]}"
    client = secure.ca.issue(prefix)
    settings = _settings(prefix, secure.mtls, _mtls(secure, client))  # create_topics on, topics missing
    await grant(secure.admin, _exact_acls(f"User:{prefix}", settings))
    pipeline = Pipeline(settings, StubEngine())
    with pytest.raises(MissingTopicsError, match="may not CREATE topics") as info:
        await asyncio.wait_for(pipeline.run(), 60)
    print(f"\nno CREATE: {info.value}")


def _mtls(secure: SecureKafka, client: Any) -> dict[str, Any]:
    return {
        "protocol": "SSL",
        "ssl_cafile": str(secure.ca.cert_file),
        "ssl_certfile": str(client.cert),
        "ssl_keyfile": str(client.key),
    }
