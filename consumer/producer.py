"""Publishing stage: the Kafka producer (idempotent, acks=all) and the per-partition ordered emitter.

`Producer.send` enqueues a record and returns the delivery future without waiting for the broker (it awaits
only when aiokafka's accumulator is full, which is the producer's own backpressure). `send_retrying` waits
for the acknowledgement and retries transient errors with tenacity. Records sent to one topic partition are
delivered in send order (idempotence keeps order across aiokafka's internal retries). `send_many` batches
records per output partition. `Emitter` turns each input record's outcome into output or DLQ records, in
offset order per input partition, and marks the offset done once every output is acknowledged.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from consumer.decode import stage_for
from consumer.dlq import DlqGuard, DlqGuardTrippedError, dead_letter
from consumer.logging import get_logger
from consumer.metrics import Metrics
from consumer.offsets import OffsetTracker
from consumer.retry import EngineError, transient_retry
from consumer.router import InputRecord, OutRecord, route_outputs
from consumer.settings import KafkaSettings, Settings
from consumer.source import client_options
from schemas.dead_letter import DlqStage
from schemas.errors import DlqReason, RequestError
from schemas.routing import EngineInfo
from schemas.systemone import SystemOneResponse

log = get_logger("consumer.producer")

PARTITIONS_TTL_S = 30.0  # how long a topic's partition list is reused before asking the metadata again


class Producer:
    """An idempotent `acks=all` producer. `start()` before use, `stop()` flushes and closes."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._partitioner = DefaultPartitioner()
        self._partitions: dict[str, tuple[float, list[int]]] = {}
        self._producer = AIOKafkaProducer(
            **client_options(settings),
            acks="all",
            enable_idempotence=True,
            linger_ms=settings.linger_ms,
            max_batch_size=256 * 1024,
            max_request_size=34 * 1024 * 1024,  # DLQ records carry original values up to 32 MiB
        )

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        """Flush pending records (waits for acks) and close."""
        await self._producer.stop()

    async def flush(self) -> None:
        await self._producer.flush()

    async def send(self, record: OutRecord) -> asyncio.Future[Any]:
        """Enqueue `record`; the returned future resolves to its RecordMetadata once acknowledged."""
        fut: asyncio.Future[Any] = await self._producer.send(
            record.topic, value=record.value, key=record.key, headers=list(record.headers)
        )
        return fut

    async def send_many(self, records: Sequence[OutRecord]) -> list[asyncio.Future[Any]]:
        """Enqueue `records` as one batch per topic partition; returns, per record, its batch's future.

        Partitions are chosen like aiokafka's default partitioner (murmur2 of the key), so a key always maps
        to the same partition as with `send`; records of one partition keep their order. Far cheaper per
        record than `send` (one accumulator call per batch instead of per record).
        """
        groups: dict[tuple[str, int], list[int]] = {}
        for index, record in enumerate(records):
            part = await self._partition_for(record)
            groups.setdefault((record.topic, part), []).append(index)
        futures: list[asyncio.Future[Any] | None] = [None] * len(records)
        for (topic, part), indexes in groups.items():
            batch = self._producer.create_batch()
            members: list[int] = []
            for index in indexes:
                rec = records[index]
                if (
                    batch.append(key=rec.key, value=rec.value, timestamp=None, headers=list(rec.headers))
                    is None
                ):
                    if members:  # batch full: ship it and start the next one
                        fut = await self._producer.send_batch(batch, topic, partition=part)
                        for member in members:
                            futures[member] = fut
                        members = []
                        batch = self._producer.create_batch()
                    if (
                        batch.append(key=rec.key, value=rec.value, timestamp=None, headers=list(rec.headers))
                        is None
                    ):
                        futures[index] = await self.send(rec)  # larger than a batch: aiokafka sends it alone
                        continue
                members.append(index)
            if members:
                fut = await self._producer.send_batch(batch, topic, partition=part)
                for member in members:
                    futures[member] = fut
        return [fut for fut in futures if fut is not None]

    async def _partition_for(self, record: OutRecord) -> int:
        now = time.monotonic()
        cached = self._partitions.get(record.topic)
        if cached is None or now - cached[0] > PARTITIONS_TTL_S:
            parts = sorted(await self._producer.partitions_for(record.topic))
            cached = (now, parts)
            self._partitions[record.topic] = cached
        parts = cached[1]
        return int(self._partitioner(record.key, parts, parts))

    async def send_retrying(self, record: OutRecord, attempts: int) -> Any:
        """Send and wait for the acknowledgement, retrying transient errors (tenacity); re-raises the last."""
        async for attempt in transient_retry(attempts):
            with attempt:
                return await (await self.send(record))
        raise AssertionError("unreachable")  # pragma: no cover


@dataclass(slots=True, eq=False)
class Work:
    """One fetched record on its way through the pipeline."""

    record: InputRecord
    event_id: str | None
    future: asyncio.Future[Any] | None = None


@dataclass(slots=True, eq=False)
class PartitionState:
    """Per input partition: the ordered queue its emitter publishes from."""

    tp: Any
    items: deque[Work | None] = field(default_factory=deque)  # offset order; None = stop
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    closing: bool = False  # revocation began: take no more records
    revoked: bool = False  # no longer owned: publish nothing, track nothing


class Emitter:
    """Publishes each record's outcome in offset order per partition and tracks acknowledgements.

    An answered record becomes the decisions and route records (`router`); a failed one a DLQ record (`dlq`),
    after the DLQ guard agrees. When every output of a record is acknowledged, its offset is marked done in
    the tracker. Transient delivery errors are retried (tenacity); exhausting them, or the guard tripping, is
    fatal (`on_fatal`), and nothing more is published. The queue is unbounded here; the pipeline bounds it.
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
    ) -> None:
        self._settings = settings
        self._producer = producer
        self._tracker = tracker
        self._metrics = metrics
        self._engine_info = engine_info
        self._guard = DlqGuard(settings.dlq)
        self._on_fatal = on_fatal
        self._on_progress = on_progress
        self._failed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.in_flight = 0

    def open(self, tp: Any) -> PartitionState:
        state = PartitionState(tp)
        state.task = asyncio.create_task(self._run(state), name=f"clef-emit-{tp}")
        return state

    def push(self, state: PartitionState, work: Work) -> None:
        self.in_flight += 1
        state.items.append(work)
        state.wake.set()

    def close(self, state: PartitionState) -> None:
        """Stop publishing for `state` (revoked or shutting down); queued records are dropped."""
        state.revoked = True
        state.closing = True
        state.items.append(None)
        state.wake.set()

    async def wait_closed(self, timeout_s: float) -> None:
        tasks = [t for t in self._tasks if not t.done()]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout_s)
            for task in late:
                task.cancel()

    def _fail(self, exc: BaseException) -> None:
        self._failed = True
        self._on_fatal(exc)

    async def _run(self, state: PartitionState) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        while True:
            if not state.items:
                state.wake.clear()
                await state.wake.wait()
                continue
            head = state.items[0]
            if head is not None and head.future is not None and not head.future.done():
                try:
                    await head.future  # results are published in offset order: wait for the oldest
                except BaseException:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # this emitter is being cancelled (shutdown timeout)
                continue
            pending: list[tuple[Work, list[OutRecord]]] = []
            while state.items and _finished(state.items[0]):  # everything finished, in offset order
                item = state.items.popleft()
                if item is None:
                    await self._publish(state, pending)
                    return
                fut = item.future
                if state.revoked or self._failed or fut is None or fut.cancelled():
                    self.in_flight -= 1
                    continue
                try:
                    pending.append((item, self._outputs(item, fut)))
                except DlqGuardTrippedError as exc:
                    self.in_flight -= 1
                    self._fail(exc)
            await self._publish(state, pending)

    async def _publish(self, state: PartitionState, pending: list[tuple[Work, list[OutRecord]]]) -> None:
        """Send the outputs of `pending` records (in order) and attach their acknowledgement counters."""
        if not pending:
            return
        if state.revoked or self._failed:
            self.in_flight -= len(pending)
            return
        outputs = [out for _, outs in pending for out in outs]
        futures = iter(await self._producer.send_many(outputs))
        for work, outs in pending:
            _Ack(self, state, work, [(out, next(futures)) for out in outs])

    def _outputs(self, work: Work, fut: asyncio.Future[Any]) -> list[OutRecord]:
        exc = fut.exception()
        topics = self._settings.topics
        if exc is None:
            response: SystemOneResponse = fut.result()
            self._guard.record_ok()
            if response.x_state_truncated:
                self._metrics.state_truncated.inc()
            return route_outputs(
                work.record,
                response,
                event_id=work.event_id,
                routing=self._settings.routing,
                topics=topics,
                engine=self._engine_info,
            )
        self._guard.record_dead()
        if isinstance(exc, EngineError):
            reason, cause, attempts = exc.reason, exc.cause, exc.attempts
        elif isinstance(exc, RequestError):
            reason, cause, attempts = exc.reason, exc, 1
        else:
            reason, cause, attempts = DlqReason.engine_failed, exc, 1
        stage = stage_for(reason) if isinstance(exc, RequestError | EngineError) else DlqStage.publish.value
        out, info = dead_letter(
            work.record, cause, topic=topics.dlq, stage=stage, attempts=attempts, reason=reason
        )
        self._metrics.dlq.labels(reason=reason.value).inc()
        r = work.record
        log.info(
            "dead_letter",
            topic=r.topic,
            partition=r.partition,
            offset=r.offset,
            reason=reason.value,
            stage=stage,
            error=info.exception_fqcn,
        )
        return [out]

    def _acked(self, state: PartitionState, work: Work, dead: bool) -> None:
        self.in_flight -= 1
        if state.revoked:
            return
        r = work.record
        self._tracker.done(state.tp, r.offset)
        self._metrics.records.labels(outcome="dead_lettered" if dead else "answered").inc()
        if r.timestamp_ms is not None and r.timestamp_ms > 0:
            self._metrics.end_to_end.observe(max(0.0, time.time() - r.timestamp_ms / 1000.0))
        self._on_progress()

    async def _resend(self, ack: _Ack, out: OutRecord) -> None:
        self._metrics.retries.labels(kind="produce").inc()
        try:
            await self._producer.send_retrying(out, self._settings.kafka.send_attempts)
        except Exception as exc:
            self._fail(exc)
            return
        ack.one_done()


def _finished(work: Work | None) -> bool:
    return work is None or work.future is None or work.future.done()


class _Ack:
    """Counts a record's delivery acknowledgements; a failed delivery is re-sent with retries."""

    __slots__ = ("dead", "emitter", "left", "state", "work")

    def __init__(
        self,
        emitter: Emitter,
        state: PartitionState,
        work: Work,
        sent: list[tuple[OutRecord, asyncio.Future[Any]]],
    ) -> None:
        self.emitter, self.state, self.work = emitter, state, work
        self.left = len(sent)
        self.dead = any(out.topic == emitter._settings.topics.dlq for out, _ in sent)
        for out, fut in sent:
            fut.add_done_callback(functools.partial(self._delivered, out))

    def _delivered(self, out: OutRecord, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            task = asyncio.ensure_future(self.emitter._resend(self, out))
            self.emitter._tasks.add(task)
            task.add_done_callback(self.emitter._tasks.discard)
            return
        self.one_done()

    def one_done(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.emitter._acked(self.state, self.work, self.dead)
