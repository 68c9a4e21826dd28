"""Kafka producer (idempotent, acks=all), topic checks at start, and shared client options.

`Producer.send` enqueues a record and returns the delivery future without waiting for the broker (it awaits
only when aiokafka's accumulator is full, which is the producer's own backpressure). `send_retrying` waits
for the acknowledgement and retries transient errors with tenacity. Records sent to one topic partition are
delivered in send order (idempotence keeps order across aiokafka's internal retries).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from consumer.decode import stage_for
from consumer.dlq import DlqGuard, DlqGuardTrippedError, dead_letter
from consumer.logging import get_logger
from consumer.metrics import Metrics
from consumer.offsets import OffsetTracker
from consumer.retry import EngineError, transient_retry
from consumer.router import InputRecord, OutRecord, route_outputs
from consumer.settings import KafkaSettings, Settings, TopicSettings
from schemas.errors import DlqReason, RequestError
from schemas.routing import EngineInfo
from schemas.systemone import SystemOneResponse

log = get_logger("consumer.producer")


def client_options(settings: KafkaSettings) -> dict[str, Any]:
    """Connection options shared by consumer, producer and admin clients (secrets unwrapped here only)."""
    opts: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "client_id": settings.client_id,
        "security_protocol": settings.security_protocol,
    }
    if settings.sasl_mechanism is not None:
        opts["sasl_mechanism"] = settings.sasl_mechanism
        opts["sasl_plain_username"] = settings.sasl_username
        if settings.sasl_password is not None:
            opts["sasl_plain_password"] = settings.sasl_password.get_secret_value()
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        from aiokafka.helpers import create_ssl_context

        opts["ssl_context"] = create_ssl_context()
    return opts


class Producer:
    """An idempotent `acks=all` producer. `start()` before use, `stop()` flushes and closes."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._producer = AIOKafkaProducer(
            **client_options(settings),
            acks="all",
            enable_idempotence=True,
            linger_ms=settings.linger_ms,
            max_batch_size=256 * 1024,
            max_request_size=max(1024 * 1024, 33 * 1024 * 1024),
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

    async def send_retrying(self, record: OutRecord, attempts: int) -> Any:
        """Send and wait for the acknowledgement, retrying transient errors (tenacity); re-raises the last."""
        async for attempt in transient_retry(attempts):
            with attempt:
                return await (await self.send(record))
        raise AssertionError("unreachable")  # pragma: no cover


class MissingTopicsError(RuntimeError):
    """Configured topics are missing and `create_topics` is off."""


def service_topics(topics: TopicSettings, department_suffixes: Iterable[str]) -> list[str]:
    """Every topic the service reads or writes (inputs, decisions, all route topics, DLQ), deduplicated."""
    names = [*topics.input, topics.decisions, topics.review, topics.unrouted, topics.dlq]
    names += [topics.route_prefix + suffix for suffix in department_suffixes]
    return list(dict.fromkeys(names))


async def ensure_topics(settings: KafkaSettings, names: list[str]) -> list[str]:
    """Check `names` exist; create the missing ones when `create_topics` is on. Returns those created.

    Raises `MissingTopicsError` when some are missing and creation is off, or creation failed.
    """
    admin = AIOKafkaAdminClient(**client_options(settings), request_timeout_ms=15_000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [name for name in names if name not in existing]
        if not missing:
            return []
        if not settings.create_topics:
            raise MissingTopicsError(f"missing topics (create_topics is off): {', '.join(missing)}")
        new = [NewTopic(name, settings.topic_partitions, settings.replication_factor) for name in missing]
        response = await admin.create_topics(new, timeout_ms=15_000)
        for entry in response.topic_errors:
            if entry[1] not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS (a concurrent creator won)
                raise MissingTopicsError(f"creating topic {entry[0]!r} failed with error code {entry[1]}")
        log.info("topics_created", topics=missing, partitions=settings.topic_partitions)
        return missing
    finally:
        await admin.close()


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
    queue: asyncio.Queue[Work | None] = field(default_factory=asyncio.Queue)
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
        state.queue.put_nowait(work)

    def close(self, state: PartitionState) -> None:
        """Stop publishing for `state` (revoked or shutting down); queued records are dropped."""
        state.revoked = True
        state.closing = True
        state.queue.put_nowait(None)

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
            work = await state.queue.get()
            if work is None:
                return
            fut = work.future
            if fut is not None and not fut.done():
                try:
                    await fut
                except BaseException:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # this emitter is being cancelled (shutdown timeout)
            if state.revoked or self._failed or fut is None or fut.cancelled():
                self.in_flight -= 1
                continue
            try:
                outputs = self._outputs(work, fut)
            except DlqGuardTrippedError as exc:
                self.in_flight -= 1
                self._fail(exc)
                continue
            sent = [(out, await self._producer.send(out)) for out in outputs]
            _Ack(self, state, work, sent)

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
        stage = stage_for(reason) if isinstance(exc, RequestError | EngineError) else "encode"
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
