"""Publishing stage: the Kafka producer (idempotent, acks=all) and the publisher that coalesces outputs.

`Producer.send` enqueues a record and returns the delivery future without waiting for the broker (it awaits
only when aiokafka's accumulator is full, which is the producer's own backpressure). `send_retrying` waits
for the acknowledgement and retries transient errors with tenacity. Records sent to one topic partition are
delivered in send order (idempotence keeps order across aiokafka's internal retries). `send_batches`
batches records per output partition. `Publisher` gathers the outputs pushed by every input partition's
emitter (`consumer.pipeline.emitter`) and hands them to the producer in rounds, so produce batches are large.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner, murmur2

from consumer.kafka.config import client_options
from consumer.kafka.settings import KafkaSettings
from consumer.logging import get_logger
from consumer.records import OutRecord
from consumer.retry import transient_retry

log = get_logger("consumer.kafka.producer")

PARTITIONS_TTL_S = 30.0  # how long a topic's partition list is reused before asking the metadata again
KEY_HASH_CACHE = 100_000  # keys whose partitioner hash is remembered (the cache is emptied when full)


class Producer:
    """An idempotent `acks=all` producer. `start()` before use, `stop()` flushes and closes."""

    def __init__(self, settings: KafkaSettings, *, transactional_id: str | None = None) -> None:
        """`transactional_id`: a transactional producer (exactly-once mode, `consumer.kafka.transactions`);
        sends then need an open `transaction()`."""
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
            transactional_id=transactional_id,
        )

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        """Flush pending records (waits for acks) and close."""
        await self._producer.stop()

    async def flush(self) -> None:
        await self._producer.flush()

    @property
    def dead(self) -> bool:
        """Whether aiokafka's background sender has stopped with an error. It does so on some connection
        errors of a transactional producer (a lost transaction coordinator: aiokafka issue #1151, seen
        here on a broker kill -9); every later call of a dead producer fails, so it must be replaced."""
        sender: Any = getattr(self._producer, "_sender", None)  # aiokafka keeps it private
        task = getattr(sender, "sender_task", None)
        return task is not None and task.done()

    def transaction(self) -> Any:
        """An async context manager: begins a transaction, commits it on exit, aborts it on an error."""
        return self._producer.transaction()

    async def send_offsets(self, offsets: dict[TopicPartition, int], group_id: str) -> None:
        """Add the group's input offsets (next offset to read) to the open transaction."""
        await self._producer.send_offsets_to_transaction(offsets, group_id)

    async def send(self, record: OutRecord) -> asyncio.Future[Any]:
        """Enqueue `record`; the returned future resolves to its RecordMetadata once acknowledged."""
        fut: asyncio.Future[Any] = await self._producer.send(
            record.topic, value=record.value, key=record.key, headers=list(record.headers)
        )
        return fut

    async def send_batches(self, records: Sequence[OutRecord]) -> list[tuple[asyncio.Future[Any], list[int]]]:
        """Enqueue `records` as one batch per topic partition; returns each batch's future with the indexes
        (into `records`) of the records it carries.

        Partitions are chosen like aiokafka's default partitioner (murmur2 of the key), so a key always maps
        to the same partition as with `send`; records of one partition keep their order. Far cheaper per
        record than `send` (no future per record, one accumulator call per batch). Records never join a
        batch already handed to aiokafka: that would need its private accumulator state.
        """
        groups: dict[tuple[str, int], list[int]] = {}
        known: dict[str, list[int]] = {}  # partition lists checked for this call
        now = time.monotonic()
        for index, record in enumerate(records):
            topic = record.topic
            parts = known.get(topic)
            if parts is None:
                cached = self._partitions.get(topic)
                if cached is None or now - cached[0] > PARTITIONS_TTL_S:
                    cached = await self._refresh_partitions(topic)
                parts = known[topic] = cached[1]
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
        if len(groups) == 1:
            (((topic, part), indexes),) = groups.items()
            return await self._send_partition(records, topic, part, indexes)
        # Partitions are handed over concurrently: each may wait for its previous batch to drain.
        per_partition = await asyncio.gather(
            *(
                self._send_partition(records, topic, part, indexes)
                for (topic, part), indexes in groups.items()
            )
        )
        return [entry for sent in per_partition for entry in sent]

    async def _send_partition(
        self, records: Sequence[OutRecord], topic: str, part: int, indexes: list[int]
    ) -> list[tuple[asyncio.Future[Any], list[int]]]:
        """Hand `records[i] for i in indexes` (all of `topic`/`part`) to aiokafka as few batches, in order."""
        sent: list[tuple[asyncio.Future[Any], list[int]]] = []
        # One hand-over at a time per partition, so batches of a partition are queued in order
        # (aiokafka's `send_batch` waits while an earlier batch of the partition is not drained).
        lock = self._locks.get((topic, part))
        if lock is None:
            lock = self._locks[(topic, part)] = asyncio.Lock()
        async with lock:
            count, i = len(indexes), 0
            while i < count:
                batch = self._producer.create_batch()
                append = batch.append
                members = []
                while i < count:
                    rec = records[indexes[i]]
                    headers = list(rec.headers)
                    if append(key=rec.key, value=rec.value, timestamp=None, headers=headers) is None:
                        break  # the batch is full (and now closed)
                    members.append(indexes[i])
                    i += 1
                if not members:  # larger than a batch: aiokafka sends it alone, after its queued batches
                    sent.append((await self.send(records[indexes[i]]), [indexes[i]]))
                    i += 1
                    continue
                sent.append((await self._producer.send_batch(batch, topic, partition=part), members))
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


OwnerT = TypeVar("OwnerT")


class BatchSender(Protocol):
    """What `Publisher` needs from a producer (`Producer` has it; tests use fakes)."""

    async def send_batches(
        self, records: Sequence[OutRecord]
    ) -> list[tuple[asyncio.Future[Any], list[int]]]: ...


class Publisher(Generic[OwnerT]):
    """Coalesces pushed outputs into large produce batches: one task hands everything pushed so far to the
    producer (`send_batches`), waits until every batch of that round is handed over, then takes the next.

    `push(records, owner)` never waits. Rounds run one at a time, so the records of one output partition
    are sent in push order. While a round waits (aiokafka holds one queued batch per partition), new pushes
    collect for the next round; that is what makes batches large under load and small when idle. Per
    produced batch, `on_batch(records, owners, future)` is called when its future completes (acknowledged
    or failed), with each record's owner. Owners for which `is_live(owner)` is False when their round
    starts are not sent: `on_dropped(owner)` is called instead. An error handing a round over is fatal
    (`on_error`), and nothing more is sent.
    """

    def __init__(
        self,
        producer: BatchSender,
        *,
        on_batch: Callable[[list[OutRecord], list[OwnerT], asyncio.Future[Any]], None],
        is_live: Callable[[OwnerT], bool],
        on_dropped: Callable[[OwnerT], None],
        on_error: Callable[[BaseException], None],
    ) -> None:
        self._producer = producer
        self._on_batch = on_batch
        self._is_live = is_live
        self._on_dropped = on_dropped
        self._on_error = on_error
        self._buffer: list[tuple[list[OutRecord], OwnerT]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failed = False

    def start(self) -> None:
        """Start the publishing task (on the running loop)."""
        self._task = asyncio.create_task(self._run(), name="clef-publish")

    def push(self, records: list[OutRecord], owner: OwnerT) -> None:
        """Queue `records` (all owned by `owner`) for the next round (non-blocking)."""
        if self._failed:
            self._on_dropped(owner)
            return
        self._buffer.append((records, owner))
        self._wake.set()

    async def stop(self, timeout_s: float) -> None:
        """Cancel the task (waiting at most `timeout_s` for it to end) and drop what is still queued. Call it
        after draining: owners of a round cut short are neither acknowledged nor dropped."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.wait({task}, timeout=timeout_s)
        for _, owner in self._buffer:
            self._on_dropped(owner)
        self._buffer.clear()

    async def _run(self) -> None:
        while True:
            if not self._buffer:
                self._wake.clear()
                await self._wake.wait()
                continue
            pushed, self._buffer = self._buffer, []
            records: list[OutRecord] = []
            owners: list[OwnerT] = []
            live: list[OwnerT] = []
            for outs, owner in pushed:
                if not self._is_live(owner):
                    self._on_dropped(owner)
                    continue
                live.append(owner)
                records += outs
                owners += [owner] * len(outs)
            if not records:
                continue
            try:
                sent = await self._producer.send_batches(records)
            except Exception as exc:
                self._failed = True
                for owner in live:
                    self._on_dropped(owner)
                self._on_error(exc)
                return
            for fut, indexes in sent:
                members = [records[i] for i in indexes]
                member_owners = [owners[i] for i in indexes]
                fut.add_done_callback(functools.partial(self._on_batch, members, member_owners))
