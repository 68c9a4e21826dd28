"""Start-up checks against the broker, before any consumer or producer starts (`preflight`).

1. Connect to a bootstrap server with the configured security settings. A wrong password, an untrusted
   broker certificate, a rejected client certificate or a protocol mismatch fails at once with one line
   saying which (`KafkaAccessError`), instead of aiokafka's retry-and-log.
2. Ask the broker which operations this principal may do on the service's topics (Metadata v8 with
   authorized operations, KIP-430). Topics that do not exist are created when `create_topics` is on
   (`MissingTopicsError` when it is off, or when the broker refuses: no CREATE permission).
3. Require READ on the inputs and WRITE on every output (decisions, route topics, review, unrouted, DLQ).
   A missing permission stops the service at start with a message naming the topic and the operation,
   instead of failing later on the first record that goes there. READ on the consumer group is checked
   the same way (DescribeGroups with authorized operations). Transactional-id ACLs have no such query;
   aiokafka fails on them when a transactional producer starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterable
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.client import AIOKafkaClient
from aiokafka.conn import create_conn
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    for_code,
)

from consumer.kafka.config import client_options
from consumer.kafka.protocol import (
    UNSET_OPERATIONS,
    AclOperation,
    AuthorizedGroupRequest,
    AuthorizedTopicsRequest,
    TopicAccess,
    parse_group_operations,
    parse_topic_access,
)
from consumer.kafka.settings import KafkaSettings
from consumer.logging import get_logger
from consumer.settings import Settings, TopicSettings

log = get_logger("consumer.kafka.access")

CONNECT_TIMEOUT_S = 20.0
COORDINATOR_ATTEMPTS = 60  # 0.5 s apart
_UNKNOWN_TOPIC = 3
_TOPIC_AUTHORIZATION_FAILED = 29
_TOPIC_ALREADY_EXISTS = 36


class KafkaAccessError(RuntimeError):
    """The broker cannot be reached, refused the credentials, or denies an operation the service needs."""


class MissingTopicsError(RuntimeError):
    """Configured topics are missing and `create_topics` is off, or creating them failed."""


def output_topics(topics: TopicSettings, department_suffixes: Iterable[str]) -> list[str]:
    """Every topic the service writes (decisions, all route topics, review, unrouted, DLQ), deduplicated."""
    names = [topics.decisions, topics.review, topics.unrouted, topics.dlq]
    names += [topics.route_prefix + suffix for suffix in department_suffixes]
    return list(dict.fromkeys(names))


def service_topics(topics: TopicSettings, department_suffixes: Iterable[str]) -> list[str]:
    """Every topic the service reads or writes (inputs first), deduplicated."""
    return list(dict.fromkeys([*topics.input, *output_topics(topics, department_suffixes)]))


async def preflight(settings: Settings) -> None:
    """Run the checks of the module docstring (awaits the broker; every call bounded by a timeout).

    Raises `KafkaAccessError`, `MissingTopicsError` or `consumer.kafka.config.KafkaConfigError`.
    """
    kafka = settings.kafka
    reads = list(settings.topics.input)
    writes = output_topics(settings.topics, settings.routing.department_map.values())
    await check_connection(kafka)
    access = await topic_access(kafka, [*reads, *writes])
    # Unknown (3) only for topics the principal may describe; hidden ones answer 29 and are reported below.
    unknown = [name for name, entry in access.items() if entry.error_code == _UNKNOWN_TOPIC]
    if unknown:
        await _create_missing(kafka, unknown)
        for _ in range(50):  # until the new topics are in the broker's metadata (a moment after creation)
            created = await topic_access(kafka, unknown)
            access.update(created)
            if all(entry.error_code != _UNKNOWN_TOPIC for entry in created.values()):
                break
            await asyncio.sleep(0.2)
    check_operations(kafka, access, reads=reads, writes=writes)
    await check_group_access(kafka)


def _hosts(bootstrap: str) -> list[tuple[str, int]]:
    hosts = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        hosts.append((host.strip("[]") or item.strip(), int(port) if port.isdigit() else 9092))
    return hosts


async def check_connection(settings: KafkaSettings) -> None:
    """Open one authenticated connection to the first bootstrap server that answers.

    Raises `KafkaAccessError` (one line, the most telling failure of all servers) when none accepts.
    """
    opts = client_options(settings)
    failures: list[tuple[int, str]] = []
    for host, port in _hosts(settings.bootstrap_servers):
        try:
            conn = await asyncio.wait_for(
                create_conn(
                    host,
                    port,
                    client_id=settings.client_id,
                    request_timeout_ms=int(CONNECT_TIMEOUT_S * 1000),
                    ssl_context=opts.get("ssl_context"),
                    security_protocol=opts["security_protocol"],
                    sasl_mechanism=opts.get("sasl_mechanism"),
                    sasl_plain_username=opts.get("sasl_plain_username"),
                    sasl_plain_password=opts.get("sasl_plain_password"),
                    sasl_oauth_token_provider=opts.get("sasl_oauth_token_provider"),
                ),
                CONNECT_TIMEOUT_S,
            )
        except (OSError, KafkaConnectionError, SaslAuthenticationFailed, TimeoutError) as exc:
            failures.append(describe_connect_error(exc, settings, f"{host}:{port}"))
            continue
        conn.close()
        return
    _, message = max(failures)
    raise KafkaAccessError(message)


def describe_connect_error(exc: BaseException, settings: KafkaSettings, where: str) -> tuple[int, str]:
    """(rank, one-line message) for a failed connection; a higher rank says more about the cause."""
    sec = settings.security
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, SaslAuthenticationFailed):
        return 5, (
            f"Kafka SASL authentication failed at {where} for user {sec.sasl_username!r} "
            f"({sec.sasl_mechanism}): wrong user name or password? broker said: {_brief(exc)}"
        )
    if isinstance(exc, ssl.SSLCertVerificationError):
        hint = (
            "set kafka.security.ssl_check_hostname=false only if the name cannot match"
            if "hostname" in str(exc.verify_message).lower()
            else "set kafka.security.ssl_cafile to the CA that signed it"
        )
        return 5, f"TLS: the broker certificate at {where} is not trusted ({exc.verify_message}); {hint}"
    if isinstance(cause, ssl.SSLError) and "ALERT" in str(cause):
        return 4, (
            f"TLS: the broker at {where} rejected the connection ({cause.reason}): it requires a client "
            "certificate signed by a CA it trusts (kafka.security.ssl_certfile / ssl_keyfile)"
        )
    if isinstance(exc, ssl.SSLError):
        return 3, f"TLS handshake with {where} failed ({exc.reason}): is it a TLS listener?"
    if isinstance(cause, asyncio.IncompleteReadError) and sec.protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
        return 3, (
            f"Kafka at {where} closed the connection at once: the listener probably expects TLS "
            f"(kafka.security.protocol is {sec.protocol})"
        )
    if isinstance(exc, TimeoutError):
        return 1, f"Kafka at {where} did not answer within {CONNECT_TIMEOUT_S:.0f} s"
    return 0, f"cannot connect to Kafka at {where}: {_brief(exc)}"


def _brief(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


async def ensure_topics(settings: KafkaSettings, names: list[str]) -> list[str]:
    """Check `names` exist (as far as this principal can see); create the missing ones when
    `create_topics` is on. Returns those created. For the CLI tools; the service runs `preflight`.

    Raises `MissingTopicsError` when some are missing and creation is off, or creation failed.
    """
    admin = AIOKafkaAdminClient(**client_options(settings), request_timeout_ms=15_000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
    finally:
        await admin.close()
    missing = [name for name in names if name not in existing]
    if missing:
        await _create_missing(settings, missing)
    return missing


async def _create_missing(settings: KafkaSettings, missing: list[str]) -> None:
    """Create `missing` (raises `MissingTopicsError` when creation is off, denied or failed)."""
    if not settings.create_topics:
        raise MissingTopicsError(f"missing topics (create_topics is off): {', '.join(missing)}")
    admin = AIOKafkaAdminClient(**client_options(settings), request_timeout_ms=15_000)
    await admin.start()
    try:
        new = [NewTopic(name, settings.topic_partitions, settings.replication_factor) for name in missing]
        response = await admin.create_topics(new, timeout_ms=15_000)
    finally:
        await admin.close()
    denied = [entry[0] for entry in response.topic_errors if entry[1] == _TOPIC_AUTHORIZATION_FAILED]
    if denied:
        names = ", ".join(map(repr, denied))
        raise MissingTopicsError(
            f"{'topics' if len(denied) > 1 else 'topic'} {names} missing and this principal may not CREATE "
            "topics: create them beforehand (and grant the ACLs of the README), or grant CREATE"
        )
    for entry in response.topic_errors:
        if entry[1] not in (0, _TOPIC_ALREADY_EXISTS):  # already exists: a concurrent creator won
            raise MissingTopicsError(f"creating topic {entry[0]!r} failed with error code {entry[1]}")
    log.info("topics_created", topics=missing, partitions=settings.topic_partitions)


async def topic_partitions(kafka: KafkaSettings, topic: str) -> list[int]:
    """Partition ids of `topic` ([] when it does not exist), from the cluster metadata."""
    admin = AIOKafkaAdminClient(**client_options(kafka))
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return sorted(p["partition"] for t in described if t["error_code"] == 0 for p in t["partitions"])


async def topic_access(settings: KafkaSettings, names: list[str]) -> dict[str, TopicAccess]:
    """Per topic: Kafka's error code (0, 3 unknown, 29 may not describe) and this principal's allowed
    operations (Metadata v8). Raises aiokafka errors when the broker cannot be reached."""
    client = AIOKafkaClient(**client_options(settings), request_timeout_ms=15_000)
    try:
        await client.bootstrap()
        response: Any = await client.send(client.get_random_node(), AuthorizedTopicsRequest(names))
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return {entry.name: entry for entry in parse_topic_access(response)}


def check_operations(
    settings: KafkaSettings, access: dict[str, TopicAccess], *, reads: list[str], writes: list[str]
) -> None:
    """Raise `KafkaAccessError` naming every denied (operation, topic): READ on `reads`, WRITE on
    `writes`, DESCRIBE on any of them (a topic this principal may not describe is invisible to it)."""
    wanted = [(AclOperation.READ, t) for t in reads] + [(AclOperation.WRITE, t) for t in writes]
    denied: list[str] = []
    for op, topic in wanted:
        entry = access.get(topic)
        if entry is not None and entry.error_code == _TOPIC_AUTHORIZATION_FAILED:
            denied.append(f"DESCRIBE and {op.name} on topic {topic!r}")
        elif entry is None or not entry.allows(op):
            denied.append(f"{op.name} on topic {topic!r}")
    if denied:
        raise KafkaAccessError(
            f"Kafka denies {_who(settings)} {'; '.join(dict.fromkeys(denied))}: grant the ACLs listed in "
            "the README (section Production Kafka)"
        )
    log.info("kafka_access_checked", reads=len(reads), writes=len(writes))


async def check_group_access(settings: KafkaSettings) -> None:
    """Raise `KafkaAccessError` unless this principal may READ (join, commit) the consumer group.

    Retriable coordinator errors (a fresh cluster still creating its offsets topic, a coordinator moving)
    are retried for up to `COORDINATOR_ATTEMPTS` x 0.5 s; other broker errors raise `KafkaAccessError`.
    """
    group = settings.group_id
    client = AIOKafkaClient(**client_options(settings), request_timeout_ms=15_000)
    try:
        await client.bootstrap()
        for attempt in range(COORDINATOR_ATTEMPTS):
            try:  # FindCoordinator needs DESCRIBE on the group
                node = await client.coordinator_lookup(0, group)
                response: Any = await client.send(node, AuthorizedGroupRequest(group))
                error, ops = parse_group_operations(response)
            except GroupAuthorizationFailedError:
                error, ops = GroupAuthorizationFailedError.errno, UNSET_OPERATIONS
            except KafkaError as exc:
                error, ops = getattr(exc, "errno", -1), UNSET_OPERATIONS
                if not exc.retriable:
                    raise KafkaAccessError(f"describing group {group!r} failed: {_brief(exc)}") from None
            if error == 0 or not for_code(error).retriable:
                break
            if attempt < COORDINATOR_ATTEMPTS - 1:
                await asyncio.sleep(0.5)
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    if error == GroupAuthorizationFailedError.errno or (error == 0 and not _allows(ops, AclOperation.READ)):
        raise KafkaAccessError(
            f"Kafka denies {_who(settings)} READ on group {group!r} (kafka.group_id): grant the ACLs "
            "listed in the README (section Production Kafka)"
        )
    if error != 0:
        raise KafkaAccessError(f"describing group {group!r} failed: {for_code(error).__name__}")


def _allows(ops: int, op: AclOperation) -> bool:
    return ops != UNSET_OPERATIONS and bool(ops >> op & 1)


def _who(settings: KafkaSettings) -> str:
    user = settings.security.sasl_username
    return f"user {user!r}" if user else "this connection's principal"
