"""Per-partition ordered emitter: engine outcomes -> output records -> publisher -> committer.

Records travel in `Unit`s (`consumer.records`): runs of consecutive fetched records of one input partition
with one engine future, one offset span and one acknowledgement counter, so the per-record asyncio
machinery (futures, callbacks, tracker entries) is paid once per run. Each input partition has one emitter
task that publishes its units in offset order; outputs keep the input key, so records of one key keep their
order. At-least-once, outputs go through the shared coalescing `Publisher` and an acknowledged unit is
handed to the committer (`Committer.done`); exactly-once, each run of finished units goes to the
committer's transaction of the partition (`Committer.transact`), which publishes and commits at once.

Backpressure: the emitter holds every record from `push` until its outputs are acknowledged or it is
dropped, at most `capacity` of them. It is the stage that fills up when the engine or the broker is slow:
`room` says how many more records it takes, and `wait_room` awaits until it has drained to a level.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import TopicPartition

from consumer.kafka.producer import Producer, Publisher
from consumer.logging import get_logger
from consumer.metrics import Metrics
from consumer.pipeline.commit import Committer, TransactionFencedError
from consumer.pipeline.dlq import DlqGuardTrippedError
from consumer.pipeline.outputs import Outputs
from consumer.records import OutRecord, PartitionState, Unit
from consumer.settings import Settings
from schemas.routing import EngineInfo

log = get_logger("consumer.pipeline.emitter")


class Emitter:
    """Publishes each unit's outcomes in offset order per partition and hands finished units on.

    Transient delivery errors are retried (tenacity); exhausting them, or the DLQ guard tripping, is fatal
    (`on_fatal`, the pipeline's stop), and nothing more is published. `last_progress` is the monotonic
    time of the last acknowledged unit (health). Each acknowledged record's end-to-end latency is observed
    in `end_to_end` and in `class_end_to_end` under its topic's class (`classes`, input topic -> class;
    other topics: `batching.priority.default`).
    """

    def __init__(
        self,
        settings: Settings,
        producer: Producer,
        committer: Committer,
        metrics: Metrics,
        engine_info: EngineInfo,
        *,
        classes: Mapping[str, int],
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self._send_attempts = settings.kafka.send_attempts
        self._producer = producer
        self._committer = committer
        self._metrics = metrics
        self._outputs = Outputs(settings, metrics, engine_info)
        self._on_fatal = on_fatal
        self._failed = False
        self._answered = metrics.records.labels(outcome="answered")  # label children, looked up once
        self._dead_lettered = metrics.records.labels(outcome="dead_lettered")
        by_class = metrics.class_end_to_end
        self._class_end_to_end = {topic: by_class.labels(str(level)) for topic, level in classes.items()}
        self._default_end_to_end = by_class.labels(str(settings.batching.priority.default))
        self._tasks: set[asyncio.Task[Any]] = set()
        self._publisher: Publisher[Unit] = Publisher(
            producer,
            on_batch=self._delivered,
            is_live=lambda unit: not (unit.state.revoked or self._failed),
            on_dropped=self._dropped,
            on_error=self._fail,
        )
        self._publishing = False
        self.capacity = settings.kafka.max_in_flight
        self.in_flight = 0
        self.last_progress = time.monotonic()
        self._room: asyncio.Future[None] | None = None  # resolved when in_flight <= _room_level
        self._room_level = 0

    # ---- partitions ---------------------------------------------------------------------------------------
    def open(self, tp: TopicPartition) -> PartitionState:
        """Start the emitter of a newly assigned partition (and the shared publisher on first use). In
        exactly-once mode the committer must have opened `tp` already."""
        if not self._publishing and not self._committer.exactly_once:
            self._publisher.start()
            self._publishing = True
        state = PartitionState(tp)
        state.task = asyncio.create_task(self._run(state), name=f"clef-emit-{tp}")
        return state

    def close(self, state: PartitionState) -> None:
        """Stop publishing for `state` (revoked or shutting down); queued units are dropped."""
        state.revoked = True
        state.items.append(None)
        state.wake.set()

    async def wait_tasks(self, states: list[PartitionState], timeout_s: float) -> None:
        """Wait for the emitter tasks of closed `states` to end (an exactly-once transaction in progress
        finishes first), at most `timeout_s`."""
        tasks = {s.task for s in states if s.task is not None and not s.task.done()}
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    async def wait_closed(self, timeout_s: float) -> None:
        """Wait for the emitter tasks to end (cancelling late ones), then stop the publisher."""
        tasks = [t for t in self._tasks if not t.done()]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout_s)
            for task in late:
                task.cancel()
        await self._publisher.stop(timeout_s)

    # ---- admission and backpressure -----------------------------------------------------------------------
    def push(self, unit: Unit) -> None:
        """Queue a unit behind the earlier units of its partition (a full emitter takes it still: the
        caller asks `room` first)."""
        self.in_flight += len(unit.records)
        unit.state.items.append(unit)
        unit.state.wake.set()

    @property
    def room(self) -> int:
        """How many more records the emitter takes before it is full."""
        return self.capacity - self.in_flight

    async def wait_room(self, level: int, timeout_s: float | None) -> bool:
        """Wait until at most `level` records are in flight (True), `timeout_s` passed or `interrupt` was
        called (False unless drained by then). Event loop; one waiter at a time (the fetch loop)."""
        if self.in_flight <= level:
            return True
        fut = self._room = asyncio.get_running_loop().create_future()
        self._room_level = level
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            self._room = None
        return self.in_flight <= level

    def interrupt(self) -> None:
        """End a pending `wait_room` now (stop or fatal error). Non-blocking."""
        if self._room is not None and not self._room.done():
            self._room.set_result(None)

    def _release(self, records: int) -> None:
        self.in_flight -= records
        if self._room is not None and self.in_flight <= self._room_level and not self._room.done():
            self._room.set_result(None)

    # ---- the partition task -------------------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        self._failed = True
        self._on_fatal(exc)

    async def _run(self, state: PartitionState) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        items = state.items
        while True:
            if not items:
                state.wake.clear()
                await state.wake.wait()
                continue
            head = items[0]
            if head is not None and not head.future.done():
                try:
                    await head.future  # results are published in offset order: wait for the oldest
                except BaseException:
                    if task is not None and task.cancelling():
                        raise  # this emitter is being cancelled (shutdown timeout)
                continue
            ready: list[tuple[list[OutRecord], Unit]] = []  # exactly-once: one transaction for all
            while items and (items[0] is None or items[0].future.done()):  # finished, in offset order
                unit = items.popleft()
                if unit is None:
                    return  # `close` marked the state revoked first, so `ready` is empty here
                fut = unit.future
                if state.revoked or self._failed or fut.cancelled() or fut.exception():
                    self._dropped(unit)
                    continue
                try:
                    outputs, unit.dead = self._outputs.build(unit.records, unit.event_ids, fut.result())
                except DlqGuardTrippedError as exc:
                    self._dropped(unit)
                    self._fail(exc)
                    continue
                unit.left = len(outputs)
                if self._committer.exactly_once:
                    ready.append((outputs, unit))
                else:
                    self._publisher.push(outputs, unit)
            if ready:
                await self._transact(state, ready)

    async def _transact(self, state: PartitionState, ready: list[tuple[list[OutRecord], Unit]]) -> None:
        """Exactly-once: the outputs of `ready` (consecutive units) and the offset after the last one in
        one transaction of the committer; then the units are acknowledged. Fenced: the partition has a new
        owner, so nothing more is published for it. Any other failure after the retries is fatal."""
        units = [unit for _, unit in ready]
        try:
            await self._committer.transact(
                state.tp, [out for outs, _ in ready for out in outs], units[-1].next_offset
            )
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

    # ---- acknowledgements ---------------------------------------------------------------------------------
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
        self._release(len(unit.records))

    def _acked(self, unit: Unit) -> None:
        records = unit.records
        self._release(len(records))
        state = unit.state
        if state.revoked:
            return
        self._committer.done(state.tp, records[0].offset)
        if unit.dead:
            self._dead_lettered.inc(unit.dead)
        if unit.dead < len(records):
            self._answered.inc(len(records) - unit.dead)
        now = time.time()
        observe = self._metrics.end_to_end.observe
        # a unit's records are of one partition, so of one topic and one class
        observe_class = self._class_end_to_end.get(records[0].topic, self._default_end_to_end).observe
        for r in records:
            if r.timestamp_ms is not None and r.timestamp_ms > 0:
                seconds = max(0.0, now - r.timestamp_ms / 1000.0)
                observe(seconds)
                observe_class(seconds)
        self.last_progress = time.monotonic()
        if self.in_flight == 0:
            self._committer.flush_soon()

    async def _resend(self, unit: Unit, out: OutRecord) -> None:
        self._metrics.retries.labels(kind="produce").inc()
        try:
            await self._producer.send_retrying(out, self._send_attempts)
        except Exception as exc:
            self._fail(exc)
            return
        unit.left -= 1
        if unit.left == 0:
            self._acked(unit)
