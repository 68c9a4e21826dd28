"""Rebalance: a second member joins mid-stream; nothing is lost and every offset ends up committed.

Uses the instant stub engine (the tiny model would only slow this down): what is under test is the revoke
path (finish or abandon within a bound, commit, publish nothing for revoked partitions).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from consumer.kafka.access import topic_partitions
from consumer.pipeline.pipeline import Pipeline
from consumer.settings import Settings, load_settings
from devtools.kafka_local import LocalKafka
from devtools.stub import StubEngine, sample_event

pytestmark = pytest.mark.kafka


def _settings(
    broker: LocalKafka, prefix: str, topic: str, exactly_once: bool = False, **kafka: Any
) -> Settings:
    return load_settings(
        kafka={
            "exactly_once": exactly_once,
            "bootstrap_servers": broker.bootstrap_servers,
            "group_id": f"{prefix}.g",
            "commit_interval_ms": 100,
            "max_in_flight": 256,
            "fetch_max_records": 64,
            "revoke_timeout_s": 5,
            "session_timeout_ms": 10_000,
            **kafka,
        },
        topics={
            "input": [topic],
            "decisions": f"{prefix}.decisions",
            "route_prefix": f"{prefix}.route.",
            "review": f"{prefix}.route.review",
            "unrouted": f"{prefix}.route.unrouted",
            "dlq": f"{prefix}.dlq",
        },
        batching={"max_batch_records": 16, "max_wait_ms": 5},
        http={"enabled": False},
    )


class SlowStub(StubEngine):
    """Stub engine that takes a little time per batch, so work is in flight when the rebalance starts."""

    def execute(self, batch: Any) -> Any:
        time.sleep(0.01)
        return super().execute(batch)


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
async def test_member_joins_mid_stream_nothing_lost(
    kafka_broker: LocalKafka, new_topic: Any, exactly_once: bool
) -> None:
    total = 4000
    topic = new_topic("in", partitions=6)
    prefix = f"reb-{uuid.uuid4().hex[:6]}"
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_broker.bootstrap_servers, acks="all", enable_idempotence=True, linger_ms=10
    )
    await producer.start()
    futs = [await producer.send(topic, sample_event(i), key=f"k{i % 40}".encode()) for i in range(total)]
    await asyncio.gather(*futs)
    await producer.stop()

    settings = _settings(kafka_broker, prefix, topic, exactly_once)
    first = Pipeline(settings, SlowStub(settings.batching.limits))
    task_a = asyncio.create_task(first.run())
    deadline = time.monotonic() + 60
    while sum(first.committed().values()) < 300:
        assert time.monotonic() < deadline
        assert not task_a.done()
        await asyncio.sleep(0.05)
    second = Pipeline(settings, SlowStub(settings.batching.limits))
    task_b = asyncio.create_task(second.run())
    try:
        committed = await _wait_group_done(kafka_broker, settings, topic, total, timeout_s=120)
        assert committed == total
        assert second.metrics.rebalances.labels(kind="assigned")._value.get() >= 1
        assert first.metrics.rebalances.labels(kind="revoked")._value.get() >= 2
    finally:
        first.request_stop()
        second.request_stop()
        await asyncio.wait_for(asyncio.gather(task_a, task_b), 60)

    decisions = await _read_decisions(
        kafka_broker, settings.topics.decisions, "read_committed" if exactly_once else "read_uncommitted"
    )
    answered = {(d["source"]["partition"], d["source"]["offset"]) for d in decisions}
    assert len(answered) == total  # nothing lost
    if exactly_once:
        assert len(decisions) == total  # and, read committed, nothing twice
    print(f"\nrebalance: {len(decisions) - total} duplicate decisions for {total} events")


async def _wait_group_done(
    broker: LocalKafka, settings: Settings, topic: str, total: int, timeout_s: float
) -> int:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    await admin.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            offsets = await admin.list_consumer_group_offsets(settings.kafka.group_id)
            committed: int = sum(m.offset for tp, m in offsets.items() if tp.topic == topic and m.offset > 0)
            if committed >= total or time.monotonic() > deadline:
                return committed
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def _read_decisions(broker: LocalKafka, topic: str, isolation_level: str) -> list[dict[str, Any]]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False, isolation_level=isolation_level
    )
    await consumer.start()
    out: list[dict[str, Any]] = []
    try:
        parts = [
            TopicPartition(topic, p)
            for p in await topic_partitions(
                load_settings().kafka.model_copy(update={"bootstrap_servers": broker.bootstrap_servers}),
                topic,
            )
        ]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        todo = {tp for tp in parts if ends[tp] > 0}
        while todo:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out += [json.loads(r.value) for r in records]
            todo = {tp for tp in todo if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()
    return out


SLOW_SERVICE = Path(__file__).with_name("slow_service.py")
REPO = Path(__file__).resolve().parents[2]


def _service_env(settings: Settings, batch_s: float) -> dict[str, str]:
    """The environment of a `slow_service.py` subprocess running with `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEF_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["SLOW_STUB_BATCH_S"] = str(batch_s)
    for section in ("kafka", "topics", "batching"):
        for key, value in getattr(settings, section).model_dump(mode="json").items():
            if value is not None:
                text = value if isinstance(value, str) else json.dumps(value)
                env[f"CLEF_{section.upper()}__{key.upper()}"] = text
    env["CLEF_HTTP__ENABLED"] = "false"
    return env


def _start_service(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(SLOW_SERVICE)],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )


def _log_lines(log: Path) -> list[str]:
    return log.read_text(errors="replace").splitlines()


def _events(lines: list[str], name: str) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        if line.startswith("{") and f'"event": "{name}"' in line:
            out.append(json.loads(line))
    return out


@pytest.mark.parametrize("sigterm_first", [False, True], ids=["join-then-sigterm", "sigterm-then-join"])
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
async def test_sigterm_while_draining_for_a_joining_member(
    kafka_broker: LocalKafka, new_topic: Any, tmp_path: Path, exactly_once: bool, sigterm_first: bool
) -> None:
    """Issue 19. Member A (a `clef-router run` subprocess, slow engine: a drain of its full in-flight
    window outlasts the 6 s session timeout) and member B joining: either SIGTERM reaches A while it drains
    for B's join (mid-rebalance), or B joins while A drains for its SIGTERM. A must stay in the group
    through the drain (no duplicates at-least-once), then leave instead of rejoining (no partition for a
    leaving member), and exit within `shutdown_timeout_s` without an ERROR line."""
    total = 1200
    topic = new_topic("in", partitions=6)
    prefix = f"term-{uuid.uuid4().hex[:6]}"
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_broker.bootstrap_servers, acks="all", enable_idempotence=True, linger_ms=10
    )
    await producer.start()
    futs = [await producer.send(topic, sample_event(i), key=f"k{i % 40}".encode()) for i in range(total)]
    await asyncio.gather(*futs)
    await producer.stop()
    settings = _settings(
        kafka_broker,
        prefix,
        topic,
        exactly_once,
        session_timeout_ms=6_000,
        revoke_timeout_s=10,
        commit_timeout_s=3,
        shutdown_timeout_s=25,
        max_in_flight=256,  # 16 batches of 16 at 0.5 s: about 8 s to drain, over the session timeout
    )
    log = tmp_path / "a.log"
    proc = _start_service(_service_env(settings, batch_s=0.5), log)
    second: Pipeline | None = None
    task_b: asyncio.Task[None] | None = None
    try:
        deadline = time.monotonic() + 90
        while sum((await _group_offsets(kafka_broker, settings)).values()) < 100:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            await asyncio.sleep(0.2)
        revokes_before = len(_events(_log_lines(log), "partitions_revoking"))
        if sigterm_first:
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
        second = Pipeline(settings, StubEngine(settings.batching.limits))
        task_b = asyncio.create_task(second.run())
        while True:  # A is in its revoke callback for B's join
            revoking = _events(_log_lines(log), "partitions_revoking")[revokes_before:]
            if revoking:
                break
            assert proc.poll() is None, log.read_text()[-3000:]
            assert not task_b.done()
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            await asyncio.sleep(0.05)
        assert revoking[0]["in_flight"] > 50, revoking[0]  # with work in flight
        if not sigterm_first:
            await asyncio.sleep(0.5)
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
        exit_s = time.monotonic() - sent
        assert code == 0, log.read_text()[-3000:]
        committed = await _wait_group_done(kafka_broker, settings, topic, total, timeout_s=120)
        assert committed == total
    finally:
        if proc.poll() is None:
            proc.kill()
        if second is not None and task_b is not None:
            second.request_stop()
            await asyncio.wait_for(task_b, 60)

    lines = _log_lines(log)
    revoked = [e for e in _events(lines, "partitions_revoked") if e["partitions"] > 0]
    stopped = _events(lines, "pipeline_stopped")
    isolation = "read_committed" if exactly_once else "read_uncommitted"
    decisions = await _read_decisions(kafka_broker, settings.topics.decisions, isolation)
    answered = {(d["source"]["partition"], d["source"]["offset"]) for d in decisions}
    duplicates = len(decisions) - len(answered)
    mode = "exactly-once" if exactly_once else "at-least-once"
    order = "SIGTERM then join" if sigterm_first else "join then SIGTERM"
    print(
        f"\n{mode}, {order}: {duplicates} duplicate decisions for {total} events; member A revokes "
        f"{[(e['partitions'], e['abandoned_runs'], e['seconds']) for e in revoked]} "
        f"(partitions, abandoned runs, s); member B revoke callbacks "
        f"{second.metrics.rebalances.labels(kind='revoked')._value.get():.0f}, assignments "
        f"{second.metrics.rebalances.labels(kind='assigned')._value.get():.0f}; SIGTERM-to-exit "
        f"{exit_s:.2f} s (bound {settings.kafka.shutdown_timeout_s:g} s; pipeline stop "
        f"{[(e['seconds'], e['drained']) for e in stopped]} (s, drained))"
    )
    assert len(answered) == total  # nothing lost
    assert duplicates == 0  # A was not dropped from the group while it drained
    errors = [ln for ln in lines if ln.startswith(("ERROR", "CRITICAL")) or '"level": "error"' in ln]
    assert not errors, errors[:5]
    stop_at = next(i for i, ln in enumerate(lines) if '"event": "stop_requested"' in ln)
    after_stop = "\n".join(lines[stop_at:])
    assert '"event": "partitions_assigned"' not in after_stop  # the leaving member took no partitions
    assert '"event": "group_left"' in after_stop
    assert exit_s < settings.kafka.shutdown_timeout_s


async def _group_offsets(broker: LocalKafka, settings: Settings) -> dict[TopicPartition, int]:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(settings.kafka.group_id)
        return {tp: m.offset for tp, m in offsets.items() if m.offset > 0}
    except KafkaError:
        return {}
    finally:
        await admin.close()
