"""The service pipeline: the only module that knows the order of the stages.

    source.fetch -> units (runs of up to `prepare_chunk` records of one partition) -> committer.track
      -> batcher (decode + prepare in threads, the engine in its GPU thread) -> the partition's emitter
      (offset order) -> outputs (router | dlq) -> publisher -> producer (acks=all) -> committer.done
      -> committer: periodic commit of the contiguous watermark
    exactly-once: emitter -> committer.transact (outputs and the input offset in one transaction)

A unit carries one engine future, one offset span and one acknowledgement counter for its records, so the
per-record cost on the event loop is the routing and the produce append, not asyncio machinery.
Per-key order: each input partition has one emitter that publishes results in offset order, the publisher
sends in push order, and outputs keep the input key, so records of one key keep their order.
Backpressure: the emitter holds every record from fetch to acknowledgement, at most `kafka.max_in_flight`.
When it is full the fetch loop awaits its room; when it stays full for `PAUSE_AFTER_S` every partition is
paused until it has drained to half. Priority (`consumer.pipeline.admission`): each unit is submitted in its
topic's class, and the last records of the bound are kept for urgent topics (fetched alone meanwhile).
Rebalance: revoked partitions stop taking records, get up to `revoke_timeout_s` to finish, and are handed
to the committer (last commit, or closing their transactional producers); anything still unfinished is
dropped unpublished (the settings check that this fits inside the rebalance timeout).
Exactly-once (`kafka.exactly_once`): the committer starts each assigned partition's transactional producer
while the partition is paused, so no record of it is taken before the previous owner is fenced.
Stop (`request_stop`, e.g. SIGTERM): fetching stops at once (also mid-rebalance); what is in flight
drains while the member still owns its partitions, then is committed, and the member leaves the group. A
rebalance during the drain revokes as usual and the member then leaves instead of rejoining; partitions
assigned while stopping are declined by leaving. Everything returns within `shutdown_timeout_s`.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Generic, TypeVar

from aiokafka import ConsumerRecord, TopicPartition

from consumer.batching.batcher import Batcher
from consumer.batching.engine_batcher import RequestCheck, answer_body, engine_batcher
from consumer.kafka.access import preflight
from consumer.kafka.producer import Producer
from consumer.kafka.source import Source
from consumer.logging import get_logger
from consumer.metrics import Metrics
from consumer.pipeline.admission import TopicClasses, wait_for_room
from consumer.pipeline.commit import Committer
from consumer.pipeline.decode import decode_value, header_event_id
from consumer.pipeline.emitter import Emitter
from consumer.pipeline.outputs import default_engine_info
from consumer.pipeline.shutdown import Stages, shutdown
from consumer.records import InputRecord, PartitionState, Unit
from consumer.runtime import tune_process
from consumer.settings import Settings
from engine.types import PreparedLike, ServingEngine
from schemas.parse import RequestLimits
from schemas.routing import EngineInfo
from schemas.systemone import SystemOneResponse

log = get_logger("consumer.pipeline.pipeline")

P = TypeVar("P", bound=PreparedLike)
S = TypeVar("S")
R = TypeVar("R")


class Pipeline(Generic[P, S, R]):
    """Kafka -> engine -> Kafka, plus `answer` for HTTP on the same batcher. Event loop only.

    The engine is any `engine.types.ServingEngine` (its prepared, staged and ran types flow through as
    P, S, R, untouched). `source` and `producer` default to the real Kafka clients built from `settings`
    (tests pass fakes).
    """

    def __init__(
        self,
        settings: Settings,
        engine: ServingEngine[P, S, R],
        *,
        source: Source | None = None,
        producer: Producer | None = None,
        metrics: Metrics | None = None,
        engine_info: EngineInfo | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self._engine = engine
        self._limits = RequestLimits(max_value_bytes=settings.engine.max_message_bytes)
        self.batcher: Batcher[P, S, R] = engine_batcher(settings, engine, self.metrics)
        self.producer = producer or Producer(settings.kafka)
        self.source = source or Source(settings.kafka, settings.topics.input, metrics=self.metrics)
        self.committer = Committer(settings.kafka, self.source)
        self.classes = TopicClasses.from_settings(settings)
        self.emitter = Emitter(
            settings,
            self.producer,
            self.committer,
            self.metrics,
            engine_info or default_engine_info(settings.engine.model_name),
            classes=self.classes.classes,
            on_fatal=self._fail,
        )
        self._states: dict[TopicPartition, PartitionState] = {}  # open partitions (written here only)
        self._closing: set[TopicPartition] = set()  # partitions being revoked: take no more records
        self._positions: dict[TopicPartition, int] = {}
        self._stop = asyncio.Event()
        self.revoking = 0  # revoke callbacks in progress (a stop waits for them before leaving)
        self.fatal: BaseException | None = None
        self._fetched_at = time.monotonic()
        # a full emitter is waited on until it has room for about one unit, so fetches stay unit-sized
        cap = settings.kafka.max_in_flight
        self._resume_level = cap - min(settings.batching.prepare_chunk, max(1, cap // 4))
        self._lag = 0
        self.started = False
        self.started_event = asyncio.Event()  # set with `started`: the preflight passed and clients are up
        self.first_fetch_at: float | None = None  # perf_counter() of the first non-empty fetch (benchmarks)

    # ---- lifecycle ----------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Run until `request_stop` or a fatal error; commits what is done before returning.

        Raises the fatal error (e.g. `DlqGuardTrippedError`, exhausted transient retries) after shutdown.
        """
        await preflight(self.settings)  # credentials, topics, ACLs: fail here with one clear line
        await self.batcher.start()
        await self.producer.start()
        await self.source.start(on_assigned=self._on_assigned, on_revoked=self._on_revoked)
        tune_process(self.settings)
        self.started = True
        self.started_event.set()
        self.metrics.model_loaded.set(1)
        log.info(
            "pipeline_started", inputs=list(self.settings.topics.input), group=self.settings.kafka.group_id
        )
        commits = asyncio.create_task(self.committer.run(), name="clef-commit")
        commits.add_done_callback(self._commit_loop_ended)
        try:
            await self._fetch_loop()
        finally:
            await shutdown(self._stages(), commits, self._drain_all, self.open_partitions)
        if self.fatal is not None:
            raise self.fatal

    def request_stop(self) -> None:
        """Ask the pipeline to drain and stop (safe from a signal handler on the loop). Non-blocking; a
        fetch waiting for a rebalance to end returns at once."""
        if not self._stop.is_set():
            log.info("stop_requested", in_flight=self.in_flight, revoking=self.revoking > 0)
        self._stop.set()
        self.source.stop_fetching()
        self.emitter.interrupt()

    def _fail(self, exc: BaseException) -> None:
        if self.fatal is None:
            self.fatal = exc
            log.error("fatal", error=repr(exc)[:300])
        self.request_stop()

    def _commit_loop_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.exception() or RuntimeError("commit loop ended"))

    def committed(self) -> dict[TopicPartition, int]:
        """The last committed offset per owned input partition (tests, benchmarks)."""
        return self.committer.tracker.committed()

    # ---- health -------------------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self.emitter.in_flight

    def ready(self) -> bool:
        """Model loaded and at least one input partition assigned."""
        return self.started and bool(self._states) and not self._stop.is_set()

    def healthy(self) -> bool:
        """False after a fatal error, or when work is pending but nothing progressed for `watchdog_s`."""
        if self.fatal is not None:
            return False
        idle = self.in_flight == 0 and self._lag == 0
        progress = max(self._fetched_at, self.emitter.last_progress, self.committer.last_commit)
        return idle or time.monotonic() - progress < self.settings.http.watchdog_s

    # ---- fetching -----------------------------------------------------------------------------------------
    async def _fetch_loop(self) -> None:
        emitter, source, classes = self.emitter, self.source, self.classes
        while not self._stop.is_set():
            scope = classes.scope(emitter.room, source.assignment)
            if scope is None:  # full: no more records until the emitter has room
                await wait_for_room(emitter, source, self._resume_level, self._stop)
                continue
            batch = await source.fetch(scope.max_records, timeout_ms=100, partitions=scope.partitions)
            if batch:
                if self.first_fetch_at is None:
                    self.first_fetch_at = time.perf_counter()
                self._fetched_at = time.monotonic()
                for tp, records in batch.items():
                    self._admit(tp, records)
            self._lag = source.update_lag(self._positions)
            self.metrics.in_flight.set(self.in_flight)

    def _admit(self, tp: TopicPartition, records: list[ConsumerRecord]) -> None:
        """Cut fetched `records` of `tp` into units, track their spans, submit them, queue them in order."""
        state = self._states.get(tp)
        if state is None and records and tp in self.source.assignment():
            self.source.seek(tp, records[0].offset)  # assigned but not opened yet: fetch these again later
            return
        if state is None or tp in self._closing or not records:
            return  # revoked or revoking: the next owner fetches these again from the committed offset
        now, age = time.time(), self.metrics.fetch_age.observe
        for r in records:  # a timestamp of -1: the producer set none
            if r.timestamp > 0:
                age(max(0.0, now - r.timestamp / 1000.0))
        step = self.settings.batching.prepare_chunk
        priority = self.classes.of(tp.topic)
        for start in range(0, len(records), step):
            # aiokafka gives headers as (str, bytes) pairs already (`ConsumerRecord.headers`)
            run = [
                InputRecord(r.topic, r.partition, r.offset, r.key, r.value, tuple(r.headers), r.timestamp)
                for r in records[start : start + step]
            ]
            self.committer.track(tp, run[0].offset, run[-1].offset + 1)
            event_ids: list[str | None] = [None] * len(run)
            prepare = functools.partial(self._prepare, run, event_ids)
            future = self.batcher.submit(prepare, range(len(run)), priority=priority)
            self.emitter.push(Unit(state, run, event_ids, future))
        self._positions[tp] = records[-1].offset + 1

    def _prepare(self, records: list[InputRecord], event_ids: list[str | None], index: int) -> P:
        """Decode and prepare record `index` (prepare thread pool; the only writer of `event_ids`)."""
        record = records[index]
        event_ids[index] = header_event_id(record.headers) if record.headers else None
        decoded = decode_value(record.value, self.settings.routing.default_schema, self._limits)
        if event_ids[index] is None:
            event_ids[index] = decoded.event_id
        return self._engine.prepare(decoded.request)

    # ---- HTTP ---------------------------------------------------------------------------------------------
    async def answer(
        self, body: bytes, check: RequestCheck | None = None, priority: int | None = None
    ) -> SystemOneResponse:
        """Answer one SystemOne request body through the shared batcher, in class `priority` (None: the
        HTTP class, `batching.priority.http`).

        `check` (the HTTP API's model-name check) sees the parsed request in the prepare thread before the
        engine does; what it raises is re-raised here.
        Raises `RequestError` (client error), `EngineError` (engine failed on it alone), `ValueError` (a
        class outside `0..batching.priority.levels - 1`).
        """
        level = self.settings.batching.priority.http if priority is None else priority
        return await answer_body(self.batcher, self._engine, self._limits, body, check, priority=level)

    # ---- rebalance ----------------------------------------------------------------------------------------
    async def _on_assigned(self, tps: set[TopicPartition]) -> None:
        self.metrics.rebalances.labels(kind="assigned").inc()
        if self._stop.is_set():
            # Stopping: nothing of these is in flight (every earlier partition was revoked first), so
            # leaving now hands them to the other members at once instead of when the drain ends.
            log.info("partitions_declined", partitions=len(tps), reason="stopping")
            await self.source.leave_group()
            return
        new = [tp for tp in tps if tp not in self._states]
        if self.committer.exactly_once and new:
            # No record is taken before the partition's transactional producer has started (which fences
            # the previous owner): the fetch loop runs while this callback awaits.
            self.source.pause(new)
        for tp in new:
            try:
                await self.committer.open(tp)
            except Exception as exc:
                self._fail(exc)
                return
            self._states[tp] = self.emitter.open(tp)
        if self.committer.exactly_once and new and not self.source.paused:
            self.source.resume(new)
        log.info("partitions_assigned", partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in tps))

    async def _on_revoked(self, tps: set[TopicPartition]) -> None:
        """aiokafka awaits this before the member rejoins: bounded by `KafkaSettings.revoke_path_s`, which
        the settings check against the rebalance timeout."""
        self.metrics.rebalances.labels(kind="revoked").inc()
        began = time.monotonic()
        self.revoking += 1
        try:
            states = [self._states[tp] for tp in tps if tp in self._states]
            owned = [s.tp for s in states]
            log.info("partitions_revoking", partitions=len(states), in_flight=self.in_flight)
            self._closing.update(owned)
            await self.drain(owned, self.settings.kafka.revoke_timeout_s)
            for state in states:
                self.emitter.close(state)
            if self.committer.exactly_once:
                # a transaction still open would commit outputs and offsets after the next owner starts
                await self.emitter.wait_tasks(states, self.settings.kafka.revoke_timeout_s)
            abandoned = await self.committer.revoke(owned)
            for tp in owned:
                self._positions.pop(tp, None)
                self._closing.discard(tp)
                del self._states[tp]
            log.info(
                "partitions_revoked",
                partitions=len(states),
                abandoned_runs=abandoned,
                seconds=round(time.monotonic() - began, 3),
            )
        finally:
            self.revoking -= 1
        if self._stop.is_set():
            # Everything was revoked (eager rebalancing) and committed: leave rather than rejoin, so this
            # member, which is shutting down, is handed no partition it would never fetch.
            await self.source.leave_group()

    async def drain(self, tps: list[TopicPartition] | None, timeout_s: float) -> bool:
        """Wait until the given partitions have nothing pending (None: nothing in flight and no revoke in
        progress); False on timeout or a fatal error."""
        deadline = time.monotonic() + timeout_s
        while self.fatal is None:
            pending = self.committer.pending(tps) if tps is not None else self.in_flight + self.revoking
            if pending == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return False

    def open_partitions(self) -> list[PartitionState]:
        """The emitter queues of the partitions owned now (shutdown)."""
        return list(self._states.values())

    # ---- shutdown -----------------------------------------------------------------------------------------
    def _stages(self) -> Stages[P, S, R]:
        """The stages and bounds `consumer.pipeline.shutdown` closes them with (built when `run` ends)."""
        kafka = self.settings.kafka
        return Stages(
            source=self.source,
            batcher=self.batcher,
            emitter=self.emitter,
            committer=self.committer,
            producer=self.producer,
            metrics=self.metrics,
            shutdown_timeout_s=kafka.shutdown_timeout_s,
            close_reserve_s=kafka.close_reserve_s,
        )

    async def _drain_all(self, timeout_s: float) -> bool:
        """`drain` of all in flight and every revoke in progress (False at once after a fatal error)."""
        return await self.drain(None, timeout_s)
