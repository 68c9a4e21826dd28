"""Per-partition ordered emitter: engine outcomes -> output or DLQ records -> publisher -> offsets done.

Records travel in `Unit`s: runs of consecutive fetched records of one input partition with one engine
future, one offset span and one acknowledgement counter, so the per-record asyncio machinery (futures,
callbacks, tracker entries) is paid once per run. Each input partition has one emitter task that publishes
its units in offset order; outputs keep the input key, so records of one key keep their order. In
exactly-once mode the emitter publishes through its partition's transactions instead of the shared
publisher (`consumer.transactions`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from consumer.decode import stage_for
from consumer.dlq import DlqGuard, DlqGuardTrippedError, dead_letter
from consumer.logging import get_logger
from consumer.metrics import Metrics
from consumer.offsets import OffsetTracker
from consumer.producer import Producer, Publisher
from consumer.retry import EngineError
from consumer.router import InputRecord, OutRecord, Router
from consumer.settings import Settings
from consumer.transactions import PartitionTransactions, TransactionFencedError
from schemas.dead_letter import DlqStage
from schemas.errors import DlqReason, RequestError
from schemas.routing import EngineInfo, datetime_json, engine_json
from schemas.systemone import SystemOneResponse

log = get_logger("consumer.emitter")


@dataclass(slots=True, eq=False)
class PartitionState:
    """Per input partition: the ordered queue of units its emitter publishes from."""

    tp: Any
    items: deque[Unit | None] = field(default_factory=deque)  # offset order; None = stop
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    closing: bool = False  # revocation began: take no more records
    revoked: bool = False  # no longer owned: publish nothing, track nothing
    txn: PartitionTransactions | None = None  # exactly-once mode: this partition's transactional producer


@dataclass(slots=True, eq=False)
class Unit:
    """Consecutive fetched records of one input partition on their way through the pipeline.

    `event_ids[i]` is the `ce_id` header of record i, or (set by the prepare thread) the id in its value.
    The offset span tracked for the unit is `[records[0].offset, records[-1].offset + 1)`.
    """

    state: PartitionState
    records: list[InputRecord]
    event_ids: list[str | None]
    future: asyncio.Future[list[Any]] | None = None  # one outcome per record: response or exception
    left: int = 0  # outputs not yet acknowledged
    dead: int = 0  # records dead-lettered


class Emitter:
    """Publishes each unit's outcomes in offset order per partition and tracks acknowledgements.

    An answered record becomes the decisions and route records (`router`); a failed one a DLQ record (`dlq`),
    after the DLQ guard agrees. When every output of a unit is acknowledged, its offset span is marked done in
    the tracker. Transient delivery errors are retried (tenacity); exhausting them, or the guard tripping, is
    fatal (`on_fatal`), and nothing more is published. The queues are unbounded here; the pipeline bounds
    them (`in_flight` counts records). `on_progress` is called per acknowledged unit, `on_idle` when that
    left nothing in flight.
    """

    def __init__(
        self,
        settings: Settings,
        producer: Producer,
        tracker: OffsetTracker[Any],
        metrics: Metrics,
        engine_info: EngineInfo,
        *,
        on_fatal: Callable[[BaseException], None],
        on_progress: Callable[[], None],
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        self._settings = settings
        self._producer = producer
        self._tracker = tracker
        self._metrics = metrics
        self._router = Router(settings.routing, settings.topics, engine_json(engine_info))
        self._guard = DlqGuard(settings.dlq)
        self._on_fatal = on_fatal
        self._on_progress = on_progress
        self._on_idle = on_idle
        self._failed = False
        self._answered = metrics.records.labels(outcome="answered")  # label children, looked up once
        self._dead_lettered = metrics.records.labels(outcome="dead_lettered")
        self._tasks: set[asyncio.Task[Any]] = set()
        self._publisher: Publisher[Unit] = Publisher(
            producer,
            on_batch=self._delivered,
            is_live=lambda unit: not (unit.state.revoked or self._failed),
            on_dropped=self._dropped,
            on_error=self._fail,
        )
        self._publishing = False
        self.in_flight = 0

    def open(self, tp: Any, txn: PartitionTransactions | None = None) -> PartitionState:
        """Start the emitter of a newly assigned partition (and the shared publisher on first use).

        With `txn` (exactly-once mode, started already) the partition's outputs and offsets go through its
        transactions instead of the shared publisher; the emitter stops `txn` when it ends.
        """
        if not self._publishing:
            self._publisher.start()
            self._publishing = True
        state = PartitionState(tp, txn=txn)
        state.task = asyncio.create_task(self._run(state), name=f"clef-emit-{tp}")
        return state

    def push(self, unit: Unit) -> None:
        """Queue a unit (its future set) behind the earlier units of its partition."""
        self.in_flight += len(unit.records)
        unit.state.items.append(unit)
        unit.state.wake.set()

    def close(self, state: PartitionState) -> None:
        """Stop publishing for `state` (revoked or shutting down); queued units are dropped."""
        state.revoked = True
        state.closing = True
        state.items.append(None)
        state.wake.set()

    async def wait_closed(self, timeout_s: float) -> None:
        """Wait for the emitter tasks to end (cancelling late ones), then stop the publisher."""
        tasks = [t for t in self._tasks if not t.done()]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout_s)
            for task in late:
                task.cancel()
        await self._publisher.stop(timeout_s)

    def _fail(self, exc: BaseException) -> None:
        self._failed = True
        self._on_fatal(exc)

    async def _run(self, state: PartitionState) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            await self._emit(state)
        finally:
            if state.txn is not None:
                await state.txn.stop()

    async def _emit(self, state: PartitionState) -> None:
        items = state.items
        while True:
            if not items:
                state.wake.clear()
                await state.wake.wait()
                continue
            head = items[0]
            if head is not None and head.future is not None and not head.future.done():
                try:
                    await head.future  # results are published in offset order: wait for the oldest
                except BaseException:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # this emitter is being cancelled (shutdown timeout)
                continue
            ready: list[tuple[list[OutRecord], Unit]] = []  # exactly-once: one transaction for all
            while items and _finished(items[0]):  # everything finished, in offset order
                unit = items.popleft()
                if unit is None:
                    return  # `close` marked the state revoked first, so `ready` is empty here
                fut = unit.future
                if state.revoked or self._failed or fut is None or fut.cancelled() or fut.exception():
                    self._dropped(unit)
                    continue
                try:
                    outputs = self._outputs(unit, fut.result())
                except DlqGuardTrippedError as exc:
                    self._dropped(unit)
                    self._fail(exc)
                    continue
                unit.left = len(outputs)
                if state.txn is None:
                    self._publisher.push(outputs, unit)
                else:
                    ready.append((outputs, unit))
            if ready:
                await self._transact(state, ready)

    async def _transact(self, state: PartitionState, ready: list[tuple[list[OutRecord], Unit]]) -> None:
        """Exactly-once mode: publish the outputs of `ready` (consecutive units) and commit the offset
        after the last one in one transaction; then the units are acknowledged and that offset is marked
        committed. Fenced: the partition has a new owner, so nothing more is published for it. Any other
        failure after the retries is fatal."""
        assert state.txn is not None
        units = [unit for _, unit in ready]
        next_offset = units[-1].records[-1].offset + 1
        try:
            await state.txn.publish([out for outs, _ in ready for out in outs], next_offset)
        except TransactionFencedError:
            state.revoked = True
            for unit in units:
                self._dropped(unit)
            return
        except Exception as exc:
            for unit in units:
                self._dropped(unit)
            self._fail(exc)
            return
        for unit in units:
            unit.left = 0
            self._acked(unit)
        if not state.revoked:
            self._tracker.mark_committed({state.tp: next_offset})

    def _outputs(self, unit: Unit, outcomes: list[Any]) -> list[OutRecord]:
        """Output records of every record of `unit`, in order. Raises `DlqGuardTrippedError` (the unit is
        then published not at all)."""
        route = self._router.outputs
        decided_at = datetime_json(datetime.now(UTC))  # the unit's records were answered together
        guard = self._guard
        answered = 0  # counted in the guard in runs, in record order (before each dead letter)
        routed: dict[str, int] = {}  # route topic -> records, for the metric (one inc per topic per unit)
        out: list[OutRecord] = []
        for record, event_id, outcome in zip(unit.records, unit.event_ids, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                guard.record_ok(answered)
                answered = 0
                out.append(self._dead_letter(unit, record, outcome))
                continue
            response: SystemOneResponse = outcome
            answered += 1
            if response.x_state_truncated:
                self._metrics.state_truncated.inc()
            out += route(record, response, event_id, decided_at)
            routed[out[-1].topic] = routed.get(out[-1].topic, 0) + 1  # the route record comes last
        guard.record_ok(answered)
        for topic, count in routed.items():
            self._metrics.routed.labels(topic=topic).inc(count)
        return out

    def _dead_letter(self, unit: Unit, record: InputRecord, exc: BaseException) -> OutRecord:
        self._guard.record_dead()
        if isinstance(exc, EngineError):
            reason, cause, attempts = exc.reason, exc.cause, exc.attempts
        elif isinstance(exc, RequestError):
            reason, cause, attempts = exc.reason, exc, 1
        else:
            reason, cause, attempts = DlqReason.engine_failed, exc, 1
        stage = stage_for(reason) if isinstance(exc, RequestError | EngineError) else DlqStage.publish.value
        out, info = dead_letter(
            record, cause, topic=self._settings.topics.dlq, stage=stage, attempts=attempts, reason=reason
        )
        unit.dead += 1
        self._metrics.dlq.labels(reason=reason.value).inc()
        log.info(
            "dead_letter",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            reason=reason.value,
            stage=stage,
            error=info.exception_fqcn,
        )
        return out

    def _delivered(self, records: list[OutRecord], owners: list[Unit], fut: asyncio.Future[Any]) -> None:
        """One produced batch is acknowledged (or failed: its records are re-sent with retries)."""
        if fut.cancelled() or fut.exception() is not None:
            for out, unit in zip(records, owners, strict=True):
                task = asyncio.ensure_future(self._resend(unit, out))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            return
        for unit in owners:
            unit.left -= 1
            if unit.left == 0:
                self._acked(unit)

    def _dropped(self, unit: Unit) -> None:
        """A unit that will not be published (revoked, failed, cancelled): no longer in flight."""
        self.in_flight -= len(unit.records)

    def _acked(self, unit: Unit) -> None:
        records = unit.records
        self.in_flight -= len(records)
        state = unit.state
        if state.revoked:
            return
        self._tracker.done(state.tp, records[0].offset)
        if unit.dead:
            self._dead_lettered.inc(unit.dead)
        if unit.dead < len(records):
            self._answered.inc(len(records) - unit.dead)
        now = time.time()
        observe = self._metrics.end_to_end.observe
        for r in records:
            if r.timestamp_ms is not None and r.timestamp_ms > 0:
                observe(max(0.0, now - r.timestamp_ms / 1000.0))
        self._on_progress()
        if self.in_flight == 0 and self._on_idle is not None:
            self._on_idle()

    async def _resend(self, unit: Unit, out: OutRecord) -> None:
        self._metrics.retries.labels(kind="produce").inc()
        try:
            await self._producer.send_retrying(out, self._settings.kafka.send_attempts)
        except Exception as exc:
            self._fail(exc)
            return
        unit.left -= 1
        if unit.left == 0:
            self._acked(unit)


def _finished(unit: Unit | None) -> bool:
    return unit is None or unit.future is None or unit.future.done()
