"""The unit emitter (offset order, DLQ, acks -> offsets, exactly-once transactions, room), on fakes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from consumer.metrics import Metrics
from consumer.pipeline.commit import Committer
from consumer.pipeline.emitter import Emitter
from consumer.records import InputRecord, Outcome, PartitionState, Unit
from consumer.settings import load_settings
from schemas.envelope import DefaultSchema, to_request
from schemas.errors import DlqReason, RequestError
from schemas.routing import EngineInfo
from schemas.systemone import SystemOneResponse, build_response
from tests.unit.consumer.kafka.test_producer import FakeProducer, settle


def _answer(summary: str) -> SystemOneResponse:
    schema = DefaultSchema()
    request = to_request({"summary": summary}, schema)
    depts = sorted(schema.departments)
    dept = [0.9 if d == "network" else 0.1 / (len(depts) - 1) for d in depts]
    probs = {"department": dept, "urgency": [0.1, 0.1, 0.7, 0.1], "outage": [0.9, 0.1]}
    return build_response(request, probs, input_tokens=10)


class FakeCommitTarget:
    """The group consumer's commit, recorded."""

    left = False

    def __init__(self) -> None:
        self.commits: list[dict[Any, int]] = []

    async def commit(self, offsets: dict[Any, int], attempts: int) -> bool:
        self.commits.append(dict(offsets))
        return True


class Harness:
    """An emitter with a real committer on fakes; exactly-once when `txn` is given (its only producer)."""

    def __init__(self, txn: FakeTransactions | None = None, **dlq: float) -> None:
        kafka = {"exactly_once": txn is not None}
        self.settings = load_settings(http={"enabled": False}, dlq=dlq, kafka=kafka)
        self.producer = FakeProducer()
        self.target = FakeCommitTarget()
        self.committer = Committer(
            self.settings.kafka, self.target, transactions=lambda settings, tp: _given(txn)
        )
        self.tracker = self.committer.tracker
        self.fatal: list[BaseException] = []
        self.metrics = Metrics()
        self.emitter = Emitter(
            self.settings,
            self.producer,  # type: ignore[arg-type]
            self.committer,
            self.metrics,
            EngineInfo(),
            classes={"in": 0, "alerts.critical": 1},
            on_fatal=self.fatal.append,
        )

    async def open(self, tp: str) -> PartitionState:
        await self.committer.open(tp)
        return self.emitter.open(tp)

    def unit(
        self, state: PartitionState, first: int, n: int, topic: str = "in", timestamp_ms: int = 1
    ) -> tuple[Unit, asyncio.Future[list[Outcome]]]:
        records = [InputRecord(topic, 0, first + i, b"key", b"{}", (), timestamp_ms) for i in range(n)]
        future: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()
        unit = Unit(state, records, [None] * n, future)
        self.committer.track(state.tp, first, first + n)
        self.emitter.push(unit)
        return unit, future


def _given(txn: FakeTransactions | None) -> FakeTransactions:
    assert txn is not None, "at-least-once opens no transactions"
    return txn


async def test_emitter_publishes_units_in_offset_order_and_commits_after_every_ack() -> None:
    h = Harness()
    state = await h.open("p0")
    _, first = h.unit(state, 0, 2)
    _, second = h.unit(state, 2, 1)
    second.set_result([RequestError(DlqReason.bad_json, "nope")])
    await settle()
    assert h.producer.rounds == []  # the older unit is not answered yet: nothing may overtake it
    first.set_result([_answer("a"), _answer("b")])
    await settle()
    topics = [r.topic for rnd in h.producer.rounds for r in rnd]
    assert topics == ["decisions", "route.network", "decisions", "route.network", "alerts.dlq"]
    routed = h.metrics.registry.get_sample_value(
        "clef_router_routed_records_total", {"topic": "route.network"}
    )
    assert routed == 2  # the dashboard's review share divides these per route topic
    assert h.emitter.in_flight == 3
    assert h.tracker.committable() == {"p0": 0}
    h.producer.ack()
    await settle()
    assert h.tracker.committable() == {"p0": 3}
    assert h.emitter.in_flight == 0
    h.emitter.close(state)
    await h.emitter.wait_closed(1.0)


async def test_emitter_resends_failed_batches_and_drops_revoked_units() -> None:
    h = Harness()
    state = await h.open("p0")
    _, fut = h.unit(state, 0, 1)
    fut.set_result([_answer("a")])
    await settle()
    h.producer.ack(RuntimeError("transient"))
    await settle()
    assert [r.topic for r in h.producer.resent] == ["decisions", "route.network"]
    assert h.tracker.committable() == {"p0": 1}  # acknowledged through the retries
    _, late = h.unit(state, 1, 1)
    h.emitter.close(state)  # revoked before the answer arrived
    late.set_result([_answer("b")])
    await settle()
    assert h.emitter.in_flight == 0
    assert len(h.producer.rounds) == 1  # nothing published for the revoked partition
    await h.emitter.wait_closed(1.0)
    assert not h.fatal


async def test_emitter_guard_trip_publishes_nothing_of_the_unit() -> None:
    h = Harness(guard_min_records=1, guard_max_share=0.01)  # any dead letter trips the guard
    state = await h.open("p0")
    _, fut = h.unit(state, 0, 2)
    fut.set_result([_answer("a"), RequestError(DlqReason.bad_json, "nope")])
    await settle()
    assert len(h.fatal) == 1
    assert h.producer.rounds == []
    assert h.emitter.in_flight == 0
    assert h.tracker.committable() == {"p0": 0}
    h.emitter.close(state)
    await h.emitter.wait_closed(1.0)


class FakeTransactions:
    """Stands in for `consumer.kafka.transactions.PartitionTransactions`: records each transaction's records
    and
    offset; `fail` is raised by the next `publish`."""

    def __init__(self) -> None:
        self.transactions: list[tuple[list[str], int]] = []
        self.fail: BaseException | None = None
        self.stopped = False
        self.gate: asyncio.Event | None = None

    async def publish(self, records: list[Any], next_offset: int) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        self.transactions.append(([r.topic for r in records], next_offset))

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True


async def test_exactly_once_units_go_out_in_transactions_with_their_offsets() -> None:
    txn = FakeTransactions()
    txn.gate = asyncio.Event()
    h = Harness(txn)
    state = await h.open("p0")
    _, first = h.unit(state, 0, 1)
    first.set_result([_answer("a")])
    await settle()  # the first transaction waits at the gate; the next units collect meanwhile
    _, second = h.unit(state, 1, 2)
    _, third = h.unit(state, 3, 1)
    second.set_result([_answer("b"), RequestError(DlqReason.bad_json, "nope")])
    third.set_result([_answer("c")])
    txn.gate.set()
    await settle()
    assert txn.transactions == [
        (["decisions", "route.network"], 1),
        (["decisions", "route.network", "alerts.dlq", "decisions", "route.network"], 4),
    ]
    assert h.producer.rounds == []  # nothing through the shared, non-transactional publisher
    assert h.tracker.committed() == {"p0": 4}
    assert h.tracker.committable() == {}  # the consumer commits nothing: offsets went in the transactions
    assert h.emitter.in_flight == 0
    h.emitter.close(state)
    await h.emitter.wait_closed(1.0)
    assert not txn.stopped  # the committer owns the producer: it stops it on revocation
    await h.committer.revoke(["p0"])
    assert txn.stopped
    assert not h.fatal


async def _one_failed_transaction(error: BaseException) -> tuple[Harness, FakeTransactions, PartitionState]:
    """An exactly-once emitter whose first transaction (one answered unit at offset 0) raises `error`."""
    txn = FakeTransactions()
    txn.fail = error
    h = Harness(txn)
    state = await h.open("p0")
    _, fut = h.unit(state, 0, 1)
    fut.set_result([_answer("a")])
    await settle()
    return h, txn, state


async def test_exactly_once_fenced_partition_publishes_nothing_more() -> None:
    from consumer.pipeline.commit import TransactionFencedError

    h, txn, state = await _one_failed_transaction(TransactionFencedError("fenced"))
    txn.fail = None
    _, later = h.unit(state, 1, 1)
    later.set_result([_answer("b")])
    await settle()
    assert txn.transactions == []  # the partition has a new owner
    assert h.emitter.in_flight == 0
    assert h.tracker.committed() == {}
    assert not h.fatal  # a rebalance, not a failure
    h.emitter.close(state)
    await h.emitter.wait_closed(1.0)


async def test_exactly_once_failed_transaction_is_fatal() -> None:
    h, _, state = await _one_failed_transaction(RuntimeError("broker gone"))
    assert [str(e) for e in h.fatal] == ["broker gone"]
    assert h.emitter.in_flight == 0
    assert h.tracker.committed() == {}
    h.emitter.close(state)
    await h.emitter.wait_closed(1.0)


async def test_a_full_emitter_says_so_and_wakes_its_waiter_when_acknowledgements_free_room() -> None:
    h = Harness()
    h.emitter.capacity = 3
    state = await h.open("p0")
    _, fut = h.unit(state, 0, 3)
    assert h.emitter.room == 0
    assert not await h.emitter.wait_room(2, 0.02), "still full after the timeout"
    waiter = asyncio.create_task(h.emitter.wait_room(1, None))
    fut.set_result([_answer("a"), _answer("b"), _answer("c")])
    await settle()
    assert not waiter.done(), "published, not yet acknowledged: still in flight"
    h.producer.ack()
    assert await asyncio.wait_for(waiter, 1.0)
    assert h.emitter.room == 3
    blocked = asyncio.create_task(h.emitter.wait_room(-1, None))
    await asyncio.sleep(0)
    h.emitter.interrupt()  # a stop ends the wait at once
    assert not await asyncio.wait_for(blocked, 1.0)
    h.emitter.close(state)
    await h.emitter.wait_closed(1.0)


async def test_end_to_end_is_observed_per_acknowledged_record_under_its_topics_class() -> None:
    h = Harness()  # classes: "in" 0, "alerts.critical" 1; any other topic the default class, 2
    critical, bulk, other = await h.open("p0"), await h.open("p1"), await h.open("p2")
    sent_ms = int(time.time() * 1000) - 2_000  # two seconds before the acknowledgement
    _, a = h.unit(critical, 0, 2, topic="alerts.critical", timestamp_ms=sent_ms)
    _, b = h.unit(bulk, 0, 3, timestamp_ms=sent_ms)
    _, c = h.unit(other, 0, 1, topic="elsewhere", timestamp_ms=sent_ms)
    _, d = h.unit(bulk, 3, 1, timestamp_ms=0)  # no timestamp: observed nowhere
    for fut, n in ((a, 2), (b, 3), (c, 1), (d, 1)):
        fut.set_result([_answer("x")] * n)
    await settle()
    h.producer.ack()
    await settle()
    h.producer.ack()  # a round coalesced behind the first one
    await settle()

    def sample(name: str, priority: str) -> float | None:
        return h.metrics.registry.get_sample_value(
            f"clef_router_class_end_to_end_seconds_{name}", {"priority": priority}
        )

    assert h.emitter.in_flight == 0
    assert [sample("count", p) for p in ("0", "1", "2")] == [3, 2, 1]
    assert 1.9 * 2 < (sample("sum", "1") or 0) < 2.1 * 2
    assert h.metrics.registry.get_sample_value("clef_router_end_to_end_seconds_count") == 6  # as before
    for state in (critical, bulk, other):
        h.emitter.close(state)
    await h.emitter.wait_closed(1.0)
