"""Priority on the Kafka side: each unit is submitted in its topic's class, and the fetch loop keeps the
last records of the in-flight bound for urgent topics (`consumer.pipeline.admission`), on fakes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from types import SimpleNamespace
from typing import Any, cast

from aiokafka import TopicPartition

from consumer.kafka.producer import Producer
from consumer.kafka.source import Source
from consumer.pipeline.admission import FetchScope, TopicClasses
from consumer.pipeline.pipeline import Pipeline
from consumer.records import PartitionState
from consumer.settings import Settings, load_settings
from devtools.stub import StubEngine
from tests.unit.consumer.kafka.test_producer import FakeProducer

BULK, CRITICAL, QUIET = "alerts.in", "alerts.critical", "alerts.quiet"


def _settings(**kafka: int) -> Settings:
    return load_settings(
        http={"enabled": False},
        topics={"input": [BULK, CRITICAL, QUIET]},
        batching={"priority": {"topics": {CRITICAL: 1, QUIET: 2}}},  # QUIET: named, but the default class
        kafka={"max_in_flight": 64, "fetch_max_records": 16, **kafka},
    )


def test_classes_come_from_the_settings_and_only_topics_below_the_default_are_urgent() -> None:
    classes = TopicClasses.from_settings(_settings())
    assert dict(classes.classes) == {BULK: 2, CRITICAL: 1, QUIET: 2}
    assert classes.of(CRITICAL) == 1
    assert classes.of("not.an.input") == 2
    assert classes.urgent == {CRITICAL}
    assert classes.reserve == 8  # min(fetch_max_records 16, max_in_flight 64 // 8)
    assert TopicClasses.from_settings(_settings(max_in_flight=4096)).reserve == 16
    plain = TopicClasses.from_settings(load_settings(http={"enabled": False}))
    assert (plain.urgent, plain.reserve) == (frozenset(), 0)


def test_scope_keeps_the_reserve_for_urgent_partitions_only_while_one_is_assigned() -> None:
    classes = TopicClasses.from_settings(_settings())
    bulk, critical = TopicPartition(BULK, 0), TopicPartition(CRITICAL, 0)
    both = {bulk, critical, TopicPartition(QUIET, 0)}
    assert classes.scope(64, lambda: both) == FetchScope(16, None)
    assert classes.scope(12, lambda: both) == FetchScope(4, None)  # bulk stops at the reserve
    assert classes.scope(8, lambda: both) == FetchScope(8, (critical,))
    assert classes.scope(1, lambda: both) == FetchScope(1, (critical,))
    assert classes.scope(0, lambda: both) is None
    # no urgent partition here: everything is fetched until the emitter is full, as without priorities
    assert classes.scope(5, lambda: {bulk}) == FetchScope(5, None)
    assert classes.scope(0, lambda: {bulk}) is None


class _FakeBatcher:
    """`Batcher.submit`, recording each submission's priority; its futures never resolve."""

    def __init__(self) -> None:
        self.submitted: list[tuple[int, int | None]] = []  # (records, priority)

    def submit(
        self, prepare: Callable[[int], Any], items: Sequence[int], *, priority: int | None = None
    ) -> asyncio.Future[list[Any]]:
        self.submitted.append((len(items), priority))
        return asyncio.get_running_loop().create_future()


class _FakeSource:
    """The part of `Source` the fetch loop and `_admit` use; `fetch` calls are recorded."""

    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = assigned
        self.fetches: list[tuple[int, tuple[TopicPartition, ...] | None]] = []

    def assignment(self) -> set[TopicPartition]:
        return self.assigned

    async def fetch(
        self, max_records: int, timeout_ms: int = 100, partitions: Collection[TopicPartition] | None = None
    ) -> dict[TopicPartition, list[Any]]:
        self.fetches.append((max_records, None if partitions is None else tuple(partitions)))
        await asyncio.sleep(0)
        return {}

    def update_lag(self, positions: dict[TopicPartition, int]) -> int:
        return 0


class _ScriptedEmitter:
    """An emitter whose `room` follows a script; `wait_room` (the loop found it full) ends the loop."""

    capacity = 64

    def __init__(self, rooms: list[int], stop: asyncio.Event) -> None:
        self.rooms = rooms
        self.stop = stop
        self.in_flight = 0
        self.waits: list[int] = []

    @property
    def room(self) -> int:
        return self.rooms.pop(0)

    async def wait_room(self, level: int, timeout_s: float | None) -> bool:
        self.waits.append(level)
        self.stop.set()
        return True


def _pipeline(settings: Settings, source: _FakeSource) -> Pipeline[Any, Any, Any]:
    return Pipeline(
        settings, StubEngine(), source=cast(Source, source), producer=cast(Producer, FakeProducer())
    )


async def _fetches(assigned: set[TopicPartition], rooms: list[int]) -> _FakeSource:
    source = _FakeSource(assigned)
    pipeline = _pipeline(_settings(), source)
    emitter = _ScriptedEmitter(rooms, pipeline._stop)
    pipeline.emitter = emitter  # type: ignore[assignment]
    try:
        await asyncio.wait_for(pipeline._fetch_loop(), 5)
    finally:
        await pipeline.batcher.close(1.0)
    assert emitter.waits == [64 - 16]  # full once: waits for room of about one unit (prepare_chunk)
    assert emitter.rooms == []
    return source


async def test_fetch_loop_takes_only_urgent_partitions_while_bulk_room_is_exhausted() -> None:
    bulk0, bulk1, critical = TopicPartition(BULK, 0), TopicPartition(BULK, 1), TopicPartition(CRITICAL, 0)
    source = await _fetches({bulk0, bulk1, critical}, [64, 12, 8, 3, 0])
    assert source.fetches == [(16, None), (4, None), (8, (critical,)), (3, (critical,))]


async def test_fetch_loop_without_an_urgent_partition_fetches_everything_until_full() -> None:
    source = await _fetches({TopicPartition(BULK, 0), TopicPartition(QUIET, 0)}, [64, 12, 3, 0])
    assert source.fetches == [(16, None), (12, None), (3, None)]


async def test_admit_submits_each_unit_in_its_topics_class() -> None:
    settings = load_settings(
        http={"enabled": False},
        topics={"input": [BULK, CRITICAL]},
        batching={"prepare_chunk": 2, "priority": {"topics": {CRITICAL: 1}}},
    )
    bulk, critical = TopicPartition(BULK, 0), TopicPartition(CRITICAL, 3)
    pipeline = _pipeline(settings, _FakeSource({bulk, critical}))
    await pipeline.batcher.close(1.0)  # the fake below takes its place
    batcher = _FakeBatcher()
    pipeline.batcher = batcher  # type: ignore[assignment]
    for tp in (bulk, critical):
        pipeline._states[tp] = PartitionState(tp)

    pipeline._admit(bulk, [_record(bulk, i, 1) for i in range(3)])
    pipeline._admit(critical, [_record(critical, 0, 1)])
    assert batcher.submitted == [(2, 2), (1, 2), (1, 1)]  # units of prepare_chunk records
    assert pipeline.in_flight == 4


async def test_admit_observes_each_records_fetch_age() -> None:
    settings = load_settings(http={"enabled": False}, topics={"input": [BULK]})
    tp = TopicPartition(BULK, 0)
    pipeline = _pipeline(settings, _FakeSource({tp}))
    await pipeline.batcher.close(1.0)  # the fake below takes its place
    pipeline.batcher = _FakeBatcher()  # type: ignore[assignment]
    pipeline._states[tp] = PartitionState(tp)
    sent_ms = int(time.time() * 1000) - 250  # produced 250 ms ago
    stamps = [sent_ms, -1, sent_ms]  # -1: the producer set no timestamp, so no age
    pipeline._admit(tp, [_record(tp, i, ts) for i, ts in enumerate(stamps)])
    count, total = pipeline.metrics.fetch_age.totals()
    assert count == 2
    assert 0.25 <= total / count < 5.0


def _record(tp: TopicPartition, offset: int, timestamp: int) -> Any:
    """A fetched record of `tp` as `_admit` reads it (an empty JSON value)."""
    return SimpleNamespace(
        topic=tp.topic,
        partition=tp.partition,
        offset=offset,
        key=None,
        value=b"{}",
        headers=(),
        timestamp=timestamp,
    )
