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
from aiokafka.partitioner import DefaultPartitioner, murmur2

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
from schemas.routing import EngineInfo, engine_json
from schemas.systemone import SystemOneResponse

log = get_logger("consumer.producer")

PARTITIONS_TTL_S = 30.0  # how long a topic's partition list is reused before asking the metadata again
KEY_HASH_CACHE = 100_000  # keys whose partitioner hash is remembered (the cache is emptied when full)


class Producer:
    """An idempotent `acks=all` producer. `start()` before use, `stop()` flushes and closes."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._partitioner = DefaultPartitioner()
        self._partitions: dict[str, tuple[float, list[int]]] = {}
        self._key_hashes: dict[bytes, int] = {}  # key -> murmur2 (positive), as aiokafka's partitioner
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
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
        """Enqueue `records` as one batch per topic partition; returns, per record, its batch's future."""
        futures: list[asyncio.Future[Any] | None] = [None] * len(records)
        for fut, indexes in await self.send_batches(records):
            for index in indexes:
                futures[index] = fut
        return [fut for fut in futures if fut is not None]

    async def send_batches(self, records: Sequence[OutRecord]) -> list[tuple[asyncio.Future[Any], list[int]]]:
        """Enqueue `records` as one batch per topic partition; returns each batch's future with the indexes
        (into `records`) of the records it carries.

        Partitions are chosen like aiokafka's default partitioner (murmur2 of the key), so a key always maps
        to the same partition as with `send`; records of one partition keep their order. Far cheaper per
        record than `send` (no future per record, one accumulator call per batch). Records never join a
        batch already handed to aiokafka: that would need its private accumulator state.
        """
        groups: dict[tuple[str, int], list[int]] = {}
        for index, record in enumerate(records):
            topic = record.topic
            cached = self._partitions.get(topic)
            if cached is None or time.monotonic() - cached[0] > PARTITIONS_TTL_S:
                cached = await self._refresh_partitions(topic)
            parts = cached[1]
            key = record.key
            if key is None:
                part = int(self._partitioner(None, parts, parts))
            else:
                hashed = self._key_hashes.get(key)
                if hashed is None:
                    hashed = murmur2(key) & 0x7FFFFFFF
                    if len(self._key_hashes) >= KEY_HASH_CACHE:
                        self._key_hashes.clear()
                    self._key_hashes[key] = hashed
                part = parts[hashed % len(parts)]
            group = groups.get((topic, part))
            if group is None:
                groups[(topic, part)] = [index]
            else:
                group.append(index)
        sent: list[tuple[asyncio.Future[Any], list[int]]] = []
        for (topic, part), indexes in groups.items():
            count, i = len(indexes), 0
            while i < count:
                batch = self._producer.create_batch()
                members = []
                while i < count and _append(batch, records[indexes[i]]):
                    members.append(indexes[i])
                    i += 1
                # One hand-over at a time per partition, so batches of a partition are queued in order
                # (aiokafka's `send_batch` waits while an earlier batch of the partition is not drained).
                lock = self._locks.get((topic, part))
                if lock is None:
                    lock = self._locks[(topic, part)] = asyncio.Lock()
                async with lock:
                    if not members:  # larger than a batch: aiokafka sends it alone, after its queued batches
                        sent.append((await self.send(records[indexes[i]]), [indexes[i]]))
                        i += 1
                        continue
                    fut = await self._producer.send_batch(batch, topic, partition=part)
                sent.append((fut, members))
        return sent

    async def _refresh_partitions(self, topic: str) -> tuple[float, list[int]]:
        parts = sorted(await self._producer.partitions_for(topic))
        cached = (time.monotonic(), parts)
        self._partitions[topic] = cached
        return cached

    async def send_retrying(self, record: OutRecord, attempts: int) -> Any:
        """Send and wait for the acknowledgement, retrying transient errors (tenacity); re-raises the last."""
        async for attempt in transient_retry(attempts):
            with attempt:
                return await (await self.send(record))
        raise AssertionError("unreachable")  # pragma: no cover


def _append(batch: Any, rec: OutRecord) -> bool:
    """Add `rec` to an aiokafka `BatchBuilder`; False when it does not fit (the builder is then closed)."""
    return batch.append(key=rec.key, value=rec.value, timestamp=None, headers=list(rec.headers)) is not None


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
        self._engine_json = engine_json(engine_info)
        self._guard = DlqGuard(settings.dlq)
        self._on_fatal = on_fatal
        self._on_progress = on_progress
        self._failed = False
        self._answered = metrics.records.labels(outcome="answered")  # label children, looked up once
        self._dead_lettered = metrics.records.labels(outcome="dead_lettered")
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
        dlq = self._settings.topics.dlq
        outputs: list[OutRecord] = []
        owners: list[_Ack] = []
        for work, outs in pending:
            ack = _Ack(self, state, work, len(outs), any(out.topic == dlq for out in outs))
            for out in outs:
                outputs.append(out)
                owners.append(ack)
        for fut, indexes in await self._producer.send_batches(outputs):
            members = [(outputs[i], owners[i]) for i in indexes]
            fut.add_done_callback(functools.partial(self._delivered, members))

    def _delivered(self, members: list[tuple[OutRecord, _Ack]], fut: asyncio.Future[Any]) -> None:
        """One produced batch is acknowledged (or failed: its records are re-sent with retries)."""
        if fut.cancelled() or fut.exception() is not None:
            for out, ack in members:
                task = asyncio.ensure_future(self._resend(ack, out))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            return
        now = time.time()
        for _, ack in members:
            ack.left -= 1
            if ack.left == 0:
                self._acked(ack.state, ack.work, ack.dead, now)

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
                engine=self._engine_json,
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

    def _acked(self, state: PartitionState, work: Work, dead: bool, now: float) -> None:
        self.in_flight -= 1
        if state.revoked:
            return
        r = work.record
        self._tracker.done(state.tp, r.offset)
        (self._dead_lettered if dead else self._answered).inc()
        if r.timestamp_ms is not None and r.timestamp_ms > 0:
            self._metrics.end_to_end.observe(max(0.0, now - r.timestamp_ms / 1000.0))
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
    """Counts the acknowledgements a record still waits for (`Emitter._delivered` decrements it)."""

    __slots__ = ("dead", "emitter", "left", "state", "work")

    def __init__(self, emitter: Emitter, state: PartitionState, work: Work, outputs: int, dead: bool) -> None:
        self.emitter, self.state, self.work = emitter, state, work
        self.left = outputs
        self.dead = dead

    def one_done(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.emitter._acked(self.state, self.work, self.dead, time.time())
