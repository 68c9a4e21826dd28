"""The service pipeline: the only module that knows the order of the stages.

    source.fetch -> units (runs of up to `prepare_chunk` records of one partition) -> track offset span
      -> batcher (decode + prepare in threads, engine in the GPU thread) -> per-partition emitter (in
      offset order) -> router | dlq -> publisher -> producer (acks=all) -> offsets.done
      -> periodic commit of the contiguous watermark

A unit carries one engine future, one offset span and one acknowledgement counter for its records, so the
per-record cost on the event loop is the routing and the produce append, not asyncio machinery.
Per-key order: each input partition has one emitter that publishes results in offset order, the publisher
sends in push order, and outputs keep the input key, so records of one key keep their order.
Backpressure: at most `kafka.max_in_flight` records between fetch and acknowledgement; at the bound no
more records are taken, and when it stays reached for `PAUSE_AFTER_S` every partition is paused until half
have drained.
Rebalance: revoked partitions stop taking records, get up to `revoke_timeout_s` to finish, have their
watermark committed, and anything still unfinished is dropped unpublished (the settings check that this
fits inside the rebalance timeout, so the member is not dropped from the group while it drains).
Exactly-once mode (`kafka.exactly_once`): each assigned partition gets a transactional producer
(`consumer.transactions`), started while the partition is paused so no record of it is taken before the
previous owner is fenced; its emitter publishes outputs and commits offsets in one transaction per run of
finished units, so the consumer commits nothing itself.
Stop (`request_stop`, e.g. SIGTERM): fetching stops at once (also mid-rebalance); what is in flight
drains while the member still owns its partitions, then is committed, and the member leaves the group. A
rebalance during the drain revokes as usual and the member then leaves instead of rejoining; partitions
assigned while stopping are declined by leaving. Everything returns within `shutdown_timeout_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.metadata
import time
from typing import Any

from aiokafka import TopicPartition

from consumer.batcher import Batcher, EngineLike
from consumer.decode import decode_value, header_event_id
from consumer.emitter import Emitter, PartitionState, Unit
from consumer.engine_batcher import RequestCheck, answer_body, engine_batcher
from consumer.kafka_access import preflight
from consumer.logging import get_logger
from consumer.metrics import Metrics
from consumer.offsets import OffsetTracker
from consumer.producer import Producer
from consumer.router import InputRecord
from consumer.runtime import bounded, tune_gc
from consumer.settings import Settings
from consumer.source import Source
from consumer.transactions import PartitionTransactions
from schemas.parse import RequestLimits
from schemas.routing import EngineInfo
from schemas.systemone import SystemOneResponse

log = get_logger("consumer.pipeline")


PAUSE_AFTER_S = 0.5  # the in-flight bound reached this long -> pause every input partition
FULL_POLL_S = 0.005  # how often the fetch loop looks at the in-flight count while it is full or paused
EXIT_MARGIN_S = 1.0  # of settings.SHUTDOWN_RESERVE_S: left for the process to exit after `run` returns


def _version() -> str:
    try:
        return importlib.metadata.version("clef-router")
    except importlib.metadata.PackageNotFoundError:
        return ""


def default_engine_info(settings: Settings) -> EngineInfo:
    """The `engine` member of decisions when the caller gives none: this package, its version, the model."""
    return EngineInfo(name="clef-router", version=_version(), model=settings.engine.model_name)


class Pipeline:
    """Kafka -> engine -> Kafka, plus `answer` for HTTP on the same batcher. Event loop only."""

    def __init__(
        self,
        settings: Settings,
        engine: EngineLike[Any],
        *,
        metrics: Metrics | None = None,
        engine_info: EngineInfo | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self._engine = engine
        self._limits = RequestLimits(max_value_bytes=settings.engine.max_message_bytes)
        self.batcher: Batcher[Any, SystemOneResponse] = engine_batcher(settings, engine, self.metrics)
        self.tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self.producer = Producer(settings.kafka)
        self.source = Source(
            settings.kafka,
            settings.topics.input,
            on_assigned=self._on_assigned,
            on_revoked=self._on_revoked,
            metrics=self.metrics,
        )
        self._idle = asyncio.Event()  # set when nothing is left in flight: commit now
        self.emitter = Emitter(
            settings,
            self.producer,
            self.tracker,
            self.metrics,
            engine_info or default_engine_info(settings),
            on_fatal=self._fail,
            on_progress=self._beat,
            on_idle=self._idle.set,
        )
        self._states: dict[TopicPartition, PartitionState] = {}
        self._positions: dict[TopicPartition, int] = {}
        self._stop = asyncio.Event()
        self._commit_lock = asyncio.Lock()
        self._revoking = 0  # revoke callbacks in progress (a stop waits for them before leaving)
        self._fatal: BaseException | None = None
        self._last_progress = time.monotonic()
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
        await self.source.start()
        tune_gc(self.settings.gc_gen0_threshold, freeze=self.settings.gc_freeze)
        self.started = True
        self.started_event.set()
        self.metrics.model_loaded.set(1)
        log.info(
            "pipeline_started", inputs=list(self.settings.topics.input), group=self.settings.kafka.group_id
        )
        committer = asyncio.create_task(self._commit_loop(), name="clef-commit")
        try:
            await self._fetch_loop()
        finally:
            await self._shutdown(committer)
        if self._fatal is not None:
            raise self._fatal

    def request_stop(self) -> None:
        """Ask the pipeline to drain and stop (safe from a signal handler on the loop). Non-blocking; a
        fetch waiting for a rebalance to end returns at once."""
        if not self._stop.is_set():
            log.info("stop_requested", in_flight=self.in_flight, revoking=self._revoking > 0)
        self._stop.set()
        self.source.stop_fetching()

    def _fail(self, exc: BaseException) -> None:
        if self._fatal is None:
            self._fatal = exc
            log.error("fatal", error=repr(exc)[:300])
        self._stop.set()
        self.source.stop_fetching()

    def _beat(self) -> None:
        self._last_progress = time.monotonic()

    # ---- health -------------------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self.emitter.in_flight

    def ready(self) -> bool:
        """Model loaded and at least one input partition assigned."""
        return self.started and bool(self._states) and not self._stop.is_set()

    def healthy(self) -> bool:
        """False after a fatal error, or when work is pending but nothing progressed for `watchdog_s`."""
        if self._fatal is not None:
            return False
        idle = self.in_flight == 0 and self._lag == 0
        return idle or time.monotonic() - self._last_progress < self.settings.http.watchdog_s

    # ---- fetching -----------------------------------------------------------------------------------------
    async def _fetch_loop(self) -> None:
        cfg = self.settings.kafka
        full_since: float | None = None  # monotonic() since when the in-flight bound is reached
        while not self._stop.is_set():
            room = cfg.max_in_flight - self.in_flight
            if room <= 0:
                # Full: stop taking records. The consumer keeps at most one fetched response per partition
                # meanwhile; pausing would discard it (aiokafka drops the buffered records of a paused
                # partition, so they would be fetched again), so partitions are paused only when the bound
                # stays reached for `PAUSE_AFTER_S` (a slow engine), not on every short wait.
                if full_since is None:
                    full_since = time.monotonic()
                elif not self.source.paused and time.monotonic() - full_since >= PAUSE_AFTER_S:
                    self.source.pause_all()
                await asyncio.sleep(FULL_POLL_S)
                continue
            full_since = None
            if self.source.paused:
                if self.in_flight > cfg.max_in_flight // 2:
                    # every partition is paused: a fetch could only wait out its timeout
                    await asyncio.sleep(FULL_POLL_S)
                    continue
                self.source.resume_all()
            batch = await self.source.fetch(min(cfg.fetch_max_records, room), timeout_ms=100)
            if batch:
                if self.first_fetch_at is None:
                    self.first_fetch_at = time.perf_counter()
                self._beat()
                for tp, records in batch.items():
                    self._admit(tp, records)
            self._lag = self.source.update_lag(self._positions)
            self.metrics.in_flight.set(self.in_flight)

    def _admit(self, tp: TopicPartition, records: list[Any]) -> None:
        state = self._states.get(tp)
        if state is None and records and tp in self.source.assignment():
            self.source.seek(tp, records[0].offset)  # assigned but not opened yet: fetch these again later
            return
        if state is None or state.closing or not records:
            return  # revoked or revoking: the next owner fetches these again from the committed offset
        step = self.settings.batching.prepare_chunk
        for start in range(0, len(records), step):
            run = records[start : start + step]
            items: list[InputRecord] = []
            event_ids: list[str | None] = []
            for rec in run:
                # aiokafka gives headers as (str, bytes) pairs already (`ConsumerRecord.headers`)
                headers = tuple(rec.headers) if rec.headers else ()
                items.append(
                    InputRecord(
                        rec.topic, rec.partition, rec.offset, rec.key, rec.value, headers, rec.timestamp
                    )
                )
                event_ids.append(header_event_id(headers) if headers else None)
            self.tracker.track(tp, run[0].offset, run[-1].offset + 1)
            unit = Unit(state, items, event_ids)
            unit.future = self.batcher.submit(functools.partial(self._prepare, unit), range(len(items)))
            self.emitter.push(unit)
        self._positions[tp] = records[-1].offset + 1

    def _prepare(self, unit: Unit, index: int) -> Any:
        """Decode and prepare record `index` of `unit` (prepare thread pool)."""
        decoded = decode_value(unit.records[index].value, self.settings.routing.default_schema, self._limits)
        if unit.event_ids[index] is None:
            unit.event_ids[index] = decoded.event_id
        return self._engine.prepare(decoded.request)

    # ---- HTTP ---------------------------------------------------------------------------------------------
    async def answer(self, body: bytes, check: RequestCheck | None = None) -> SystemOneResponse:
        """Answer one SystemOne request body through the shared batcher.

        `check` (the HTTP API's model-name check) sees the parsed request in the prepare thread before the
        engine does; what it raises is re-raised here.
        Raises `RequestError` (client error), `EngineError` (engine failed on it alone).
        """
        return await answer_body(self.batcher, self._engine, self._limits, body, check)

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
        if self.settings.kafka.exactly_once and new:
            # No record of a partition is taken before its transactional producer has started (which
            # fences the previous owner): the fetch loop runs while this callback awaits.
            self.source.pause(new)
            for tp in new:
                txn = PartitionTransactions(self.settings.kafka, tp)
                try:
                    await txn.start()
                except Exception as exc:
                    self._fail(exc)
                    return
                self._states[tp] = self.emitter.open(tp, txn)
            if not self.source.paused:
                self.source.resume(new)
        else:
            for tp in new:
                self._states[tp] = self.emitter.open(tp)
        log.info("partitions_assigned", partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in tps))

    async def _on_revoked(self, tps: set[TopicPartition]) -> None:
        """aiokafka awaits this before the member rejoins: bounded by `KafkaSettings.revoke_path_s`, which
        the settings check against the rebalance timeout."""
        self.metrics.rebalances.labels(kind="revoked").inc()
        began = time.monotonic()
        self._revoking += 1
        try:
            states = [self._states[tp] for tp in tps if tp in self._states]
            log.info("partitions_revoking", partitions=len(states), in_flight=self.in_flight)
            for state in states:
                state.closing = True
            await self._drain([s.tp for s in states], self.settings.kafka.revoke_timeout_s)
            await self._commit({s.tp for s in states})
            abandoned = 0
            for state in states:
                abandoned += self.tracker.pending(state.tp)  # unfinished runs (units) of records
                self.emitter.close(state)
                self.tracker.forget(state.tp)
                self._positions.pop(state.tp, None)
                del self._states[state.tp]
            if self.settings.kafka.exactly_once:
                # a transaction still open would commit outputs and offsets after the next owner starts
                tasks = {s.task for s in states if s.task is not None and not s.task.done()}
                if tasks:
                    await asyncio.wait(tasks, timeout=self.settings.kafka.revoke_timeout_s)
            log.info(
                "partitions_revoked",
                partitions=len(states),
                abandoned_runs=abandoned,
                seconds=round(time.monotonic() - began, 3),
            )
        finally:
            self._revoking -= 1
        if self._stop.is_set():
            # Everything was revoked (eager rebalancing) and committed: leave rather than rejoin, so this
            # member, which is shutting down, is handed no partition it would never fetch.
            await self.source.leave_group()

    async def _drain(self, tps: list[TopicPartition] | None, timeout_s: float) -> bool:
        """Wait until the given partitions have nothing pending (all: nothing in flight and no revoke in
        progress); False on timeout or a fatal error."""
        deadline = time.monotonic() + timeout_s
        while self._fatal is None:
            if tps is not None:
                pending = sum(self.tracker.pending(tp) for tp in tps)
            else:
                pending = self.in_flight + self._revoking
            if pending == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return False

    # ---- commits and shutdown -----------------------------------------------------------------------------
    async def _commit(self, only: set[TopicPartition] | None = None) -> None:
        if self.settings.kafka.exactly_once:
            return  # offsets are committed inside each partition's transactions
        async with self._commit_lock:
            offsets = {
                tp: off
                for tp, off in self.tracker.committable().items()
                if tp in self._states and (only is None or tp in only)
            }
            if offsets and await self.source.commit(offsets, self.settings.kafka.send_attempts):
                self.tracker.mark_committed(offsets)
                self._beat()

    async def _commit_loop(self) -> None:
        """Commit every `commit_interval_ms`, and at once when the last in-flight record is acknowledged
        (so an idle service has committed everything it did, not up to one interval ago)."""
        interval = self.settings.kafka.commit_interval_ms / 1000.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), interval)
            self._idle.clear()
            try:
                await self._commit()
            except Exception as exc:
                self._fail(exc)

    async def _shutdown(self, committer: asyncio.Task[None]) -> None:
        """Drain and commit while the partitions are still owned, then leave the group and close, all
        within `shutdown_timeout_s` (a revoke in progress is part of the drain). Never raises."""
        cfg = self.settings.kafka
        self.source.stop_fetching()
        began = time.monotonic()
        deadline = began + cfg.shutdown_timeout_s - EXIT_MARGIN_S

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        drained = False
        if self._fatal is None:
            drained = await self._drain(None, max(0.0, cfg.shutdown_timeout_s - cfg.close_reserve_s))
        committer.cancel()
        for state in list(self._states.values()):
            self.emitter.close(state)  # nothing more is published: what is unfinished now is abandoned
        if not self.source.left:
            try:
                await self._commit()  # bounded by commit_timeout_s
            except Exception as exc:
                log.warning("final_commit_failed", error=repr(exc)[:300])
        abandoned = self.in_flight
        # HTTP requests already in the batcher may still be answered (Kafka results are not published).
        await self.batcher.close(left() / 3)
        # Exactly-once: a transaction being committed ends before the group is left, so the next owner
        # reads its offsets.
        await self.emitter.wait_closed(min(left() / 3, 2.0))
        left_in_time = await bounded(self._leave(), left() * 2 / 3, "leave_group")
        await bounded(self.producer.stop(), left(), "producer_stop")
        self.metrics.model_loaded.set(0)
        log.info(
            "pipeline_stopped",
            drained=drained,
            abandoned=abandoned,
            left_group=left_in_time,
            seconds=round(time.monotonic() - began, 3),
        )

    async def _leave(self) -> None:
        await self.source.leave_group()
        await self.source.stop()
