"""A stop whose drain runs out of time (issue 19): the unfinished work is abandoned (nothing published for
it, not even a dead letter), the pipeline returns within `shutdown_timeout_s`, with no ERROR line."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition
from structlog.testing import capture_logs

from consumer.kafka.access import topic_partitions
from consumer.pipeline.pipeline import Pipeline
from consumer.settings import KafkaSettings, load_settings
from devtools.kafka_local import LocalKafka
from devtools.stub import StubEngine, StubPrepared, sample_event
from engine.types import Between
from schemas.response import SystemOneResponse

pytestmark = pytest.mark.kafka


class SlowStub(StubEngine):
    """One second per batch, staged like the real engine (`stage` and `respond` in the prepare pool, `run`
    in the GPU thread): a stop finds far more work in flight than its drain can finish."""

    def stage(self, batch: Sequence[StubPrepared]) -> list[StubPrepared]:
        return list(batch)

    def run(self, staged: list[StubPrepared], between: Between | None = None) -> list[SystemOneResponse]:
        time.sleep(1.0)
        return self.execute(staged)

    def respond(self, raw: list[SystemOneResponse]) -> list[SystemOneResponse]:
        return raw


async def _count(broker: LocalKafka, topic: str) -> int:
    """Records written to `topic` (end offsets; transaction markers included, if any)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap_servers)
    await consumer.start()
    try:
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
        parts = [TopicPartition(topic, p) for p in await topic_partitions(kafka, topic)]
        return sum((await consumer.end_offsets(parts)).values())
    finally:
        await consumer.stop()


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
async def test_a_stop_that_cannot_drain_abandons_the_rest_quietly_within_its_bound(
    kafka_broker: LocalKafka, new_topic: Any, exactly_once: bool
) -> None:
    total = 400
    topic = new_topic("in", partitions=2)
    prefix = f"stop-{uuid.uuid4().hex[:6]}"
    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers, acks="all")
    await producer.start()
    await asyncio.gather(*[await producer.send(topic, sample_event(i)) for i in range(total)])
    await producer.stop()
    settings = load_settings(
        kafka={
            "exactly_once": exactly_once,
            "bootstrap_servers": kafka_broker.bootstrap_servers,
            "group_id": f"{prefix}.g",
            "commit_interval_ms": 100,
            "max_in_flight": 128,  # 8 batches of 16 at 1 s
            "fetch_max_records": 64,
            "revoke_timeout_s": 1,
            "commit_timeout_s": 1,
            "shutdown_timeout_s": 6,  # drain budget: 6 - 3 - 1 (commit) = 2 s at-least-once, 3 s exactly-once
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
    pipeline = Pipeline(settings, SlowStub(settings.batching.limits))  # batches of 16, as the service cuts
    with capture_logs() as logs:
        task = asyncio.create_task(pipeline.run())
        deadline = time.monotonic() + 60
        while pipeline.in_flight < 100:
            assert not task.done()
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)  # a batch or two answered and committed first
        in_flight = pipeline.in_flight
        asked = time.monotonic()
        pipeline.request_stop()
        await asyncio.wait_for(task, 30)
        stop_s = time.monotonic() - asked
        await asyncio.sleep(0.5)  # late done-callbacks of abandoned work would log now
    stopped = [e for e in logs if e["event"] == "pipeline_stopped"]
    dead = await _count(kafka_broker, settings.topics.dlq)
    mode = "exactly-once" if exactly_once else "at-least-once"
    print(
        f"\n{mode}: stop with {in_flight} records in flight returned in {stop_s:.2f} s (bound "
        f"{settings.kafka.shutdown_timeout_s:g} s); {stopped[0]['abandoned']} records abandoned; "
        f"{dead} dead letters"
    )
    assert stopped[0]["drained"] is False
    assert stopped[0]["abandoned"] > 0
    assert stop_s < settings.kafka.shutdown_timeout_s
    assert dead == 0  # abandoned records are not failures
    assert [e for e in logs if e["log_level"] in ("error", "critical")] == []
