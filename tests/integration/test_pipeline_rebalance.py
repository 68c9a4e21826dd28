"""Rebalance: a second member joins mid-stream; nothing is lost and every offset ends up committed.

Uses the instant stub engine (the tiny model would only slow this down): what is under test is the revoke
path (finish or abandon within a bound, commit, publish nothing for revoked partitions).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from bench.stub import StubEngine, sample_event
from consumer.dlq import topic_partitions
from consumer.kafka_local import LocalKafka
from consumer.pipeline import Pipeline
from consumer.settings import Settings, load_settings

pytestmark = pytest.mark.kafka


def _settings(broker: LocalKafka, prefix: str, topic: str, exactly_once: bool = False) -> Settings:
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
    first = Pipeline(settings, SlowStub())
    task_a = asyncio.create_task(first.run())
    deadline = time.monotonic() + 60
    while sum(first.tracker.committed().values()) < 300:
        assert time.monotonic() < deadline
        assert not task_a.done()
        await asyncio.sleep(0.05)
    second = Pipeline(settings, SlowStub())
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
