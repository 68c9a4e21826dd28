"""A priority topic on a real broker: records of `alerts.critical` (class 1) produced while a slow engine
works through a backlog on `alerts.in` are fetched at once (the in-flight bound's urgent reserve) and
decided long before the backlog is done; every input is decided exactly once and committed."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from consumer.pipeline.pipeline import Pipeline
from consumer.settings import Settings, load_settings
from devtools.kafka_local import LocalKafka
from devtools.stub import StubEngine, StubPrepared
from schemas.response import SystemOneResponse
from schemas.routing import RoutedDecision
from tests.integration.test_pipeline import _committed, _produce, _read_all

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

BACKLOG, CRITICAL = 600, 4
BATCH, BATCH_S = 8, 0.05  # the slow engine: 8 records per 50 ms, so the backlog is about 4 s of work
MAX_IN_FLIGHT = 64  # urgent reserve: min(fetch_max_records 16, 64 // 8) = 8 records


class OrderedSlowStub(StubEngine):
    """A stub engine that takes `BATCH_S` per batch and records the order it decided records in."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings.batching.limits)
        self.order: list[tuple[str, int]] = []  # (kind, seq) in decision order (GPU thread)
        self._lock = threading.Lock()

    def execute(self, batch: Sequence[StubPrepared]) -> list[SystemOneResponse]:
        time.sleep(BATCH_S)
        with self._lock:
            for p in batch:
                assert isinstance(p.request.state, dict)
                self.order.append((str(p.request.state["kind"]), int(str(p.request.state["seq"]))))
        return super().execute(batch)


def _body(kind: str, seq: int) -> bytes:
    return json.dumps(
        {"state": {"kind": kind, "seq": seq}, "questions": {"outage": {"type": "noul"}}}
    ).encode()


def _settings(broker: LocalKafka, prefix: str, bulk: str, critical: str) -> Settings:
    return load_settings(
        kafka={
            "bootstrap_servers": broker.bootstrap_servers,
            "group_id": f"{prefix}.group",
            "commit_interval_ms": 200,
            "max_in_flight": MAX_IN_FLIGHT,
            "fetch_max_records": 16,
        },
        topics={
            "input": [bulk, critical],
            "decisions": f"{prefix}.decisions",
            "route_prefix": f"{prefix}.route.",
            "review": f"{prefix}.route.review",
            "unrouted": f"{prefix}.route.unrouted",
            "dlq": f"{prefix}.dlq",
        },
        batching={
            "mode": "fixed",
            "max_batch_records": BATCH,
            "max_wait_ms": 5,
            "prepare_chunk": 4,
            "priority": {"topics": {critical: 1}},
        },
        engine={"device": "cpu"},
        http={"enabled": False},
    )


async def _wait(condition: Any, task: asyncio.Task[None], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert not task.done(), f"pipeline stopped early: {task.exception() if task.done() else ''}"
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def test_priority_topic_overtakes_a_backlog_and_nothing_is_lost(
    kafka_broker: LocalKafka, new_topic: Any
) -> None:
    bulk, critical = new_topic("alerts.in"), new_topic("alerts.critical")
    prefix = f"prio-{uuid.uuid4().hex[:6]}"
    bootstrap = kafka_broker.bootstrap_servers
    settings = _settings(kafka_broker, prefix, bulk, critical)
    await _produce(bootstrap, bulk, [(f"h{i % 5}".encode(), _body("bulk", i), []) for i in range(BACKLOG)])
    engine = OrderedSlowStub(settings)
    pipeline = Pipeline(settings, engine)
    task = asyncio.create_task(pipeline.run())
    try:
        # the backlog fills the in-flight bound and is being decided
        await _wait(lambda: len(engine.order) >= 5 * BATCH, task, 30, "the backlog never started")
        await _produce(bootstrap, critical, [(b"c", _body("critical", i), []) for i in range(CRITICAL)])
        sent_at = len(engine.order)  # records decided when the critical ones were on the broker
        await _wait(
            lambda: sum(pipeline.committed().values()) >= BACKLOG + CRITICAL, task, 40, "not all committed"
        )
    finally:
        pipeline.request_stop()
        await asyncio.wait_for(task, 30)

    order = engine.order
    last_critical = max(i for i, (kind, _) in enumerate(order) if kind == "critical")
    bulk_after = sum(1 for kind, _ in order[last_critical:] if kind == "bulk")
    print(
        f"\ncritical records produced at decision {sent_at}, all decided by {last_critical} of {len(order)}"
    )
    # Fetched at once and queued behind at most the records in flight (the batcher runs its class first):
    # far ahead of the backlog still on the broker or in the consumer's buffer.
    assert last_critical - sent_at <= MAX_IN_FLIGHT + 4 * BATCH, (sent_at, last_critical)
    assert bulk_after >= BACKLOG // 2, bulk_after  # the backlog is far from done

    decided = sorted(order)
    assert decided == sorted(
        [("bulk", i) for i in range(BACKLOG)] + [("critical", i) for i in range(CRITICAL)]
    )
    got = await _read_all(bootstrap, [settings.topics.decisions])
    sources = [RoutedDecision.from_json(r.value).source for r in got[settings.topics.decisions]]
    keys = [(s.topic, s.partition, s.offset) for s in sources]
    assert len(keys) == len(set(keys)) == BACKLOG + CRITICAL  # nothing lost, nothing published twice
    committed = await _committed(bootstrap, settings.kafka.group_id)
    assert {tp.topic: off for tp, off in committed.items()} == {bulk: BACKLOG, critical: CRITICAL}
