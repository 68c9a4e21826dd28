"""Micro-batcher shared by Kafka and HTTP: CPU prepare in a thread pool, one GPU worker thread.

Callers `submit` a run of items with their prepare function (decode + `engine.prepare`, CPU only). Each
submission is prepared by one call in a thread pool, so JSON parsing, validation, tokenizing and media
decoding overlap the GPU and never block the event loop.
Prepared records wait in arrival order. Every batch is cut by the engine's one rule within the engine's
own limits (`ServingEngine.limits`, `engine.batching.cut.take` at the packed cost: a record larger than the
budget runs alone). With `mode = "fixed"` a batch is flushed when it is full by those limits or
`max_wait_ms` after its first record became ready. With `mode = "adaptive"` (the default) the size and the
moment follow the queue and the GPU time measured per batch (`consumer.batching.adaptive`): at once while
the GPU is idle, just before it frees up while it is busy, within a budget derived from
`latency_target_ms` unless a backlog built, always within the engine's limits.
At most `max_pending_batches` batches are handed to the single GPU thread at once; the rest wait
here (and the pipeline pauses fetching through its in-flight bound).

Each submission gets one future that resolves to one outcome per item, in order: the engine's response, the
prepare call's own exception (e.g. `RequestError`), or an `EngineError` when the record failed even alone
(see `retry`). One future per run of records, not per record: the service submits a fetched run at a time.

A cut batch runs through `consumer.batching.gpu.GpuRunner`: the engine's `stage` and `respond` run in the
prepare pool, only `run` occupies the GPU thread; a failed batch is split by the engine's one rule
(`engine.batching.split`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar, cast

from consumer.batching.adaptive import AdaptiveView, CostLike, CostModel, GpuQueue, plan_adaptive
from consumer.batching.gpu import GpuRunner
from consumer.clock import Clock, SystemClock
from consumer.logging import get_logger
from consumer.metrics import Metrics
from consumer.settings import BatchingSettings
from engine.batching.cut import take
from engine.batching.split import EngineError
from engine.types import PreparedLike, ServingEngine
from schemas.errors import DlqReason
from schemas.response import SystemOneResponse

__all__ = ["Batcher", "Outcome"]

log = get_logger("consumer.batching.batcher")


P = TypeVar("P", bound=PreparedLike)
S = TypeVar("S")
R = TypeVar("R")
ItemT = TypeVar("ItemT")

Outcome = SystemOneResponse | BaseException
"""What one submitted item ends as: the engine's response, its prepare error, or an `EngineError`."""


class _Submission:
    """One `submit` call: its outcomes, how many are still missing, its future, when it became ready."""

    __slots__ = ("future", "left", "outcomes", "ready_at")

    def __init__(self, future: asyncio.Future[list[Outcome]], size: int) -> None:
        self.future = future
        self.outcomes: list[Outcome | None] = [None] * size
        self.left = size
        self.ready_at = 0.0

    def settle(self, index: int, outcome: Outcome) -> None:
        """Store one outcome; resolves the future with every outcome once the last one arrives."""
        self.outcomes[index] = outcome
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(cast("list[Outcome]", self.outcomes))


# A prepared record waiting for its batch: (prepared, its submission, its index in the submission).
_Job = tuple[P, _Submission, int]


class Batcher(Generic[P, S, R]):
    """Batches for `engine`, cut within `engine.limits` (see the module docstring); `settings` give the
    mode, the waits and the pools. Start with `start()`, stop with `close()`; all methods run on the loop."""

    def __init__(
        self,
        engine: ServingEngine[P, S, R],
        settings: BatchingSettings,
        *,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        single_attempts: int = 2,
        cost: CostLike | None = None,
    ) -> None:
        self._settings = settings
        self._limits = engine.limits
        self._clock = clock or SystemClock()
        self._metrics = metrics
        self._ready: deque[_Job[P]] = deque()
        self._wakeup = asyncio.Event()
        self._gpu_slots = asyncio.Semaphore(settings.max_pending_batches)
        self._prepare_pool = ThreadPoolExecutor(settings.prepare_workers, thread_name_prefix="clef-prepare")
        self._gpu = GpuRunner(engine, self._prepare_pool, single_attempts=single_attempts)
        self._tasks: set[asyncio.Future[Any]] = set()
        self._collector: asyncio.Task[None] | None = None
        self._closing = False
        self._queue = GpuQueue(cost if cost is not None else CostModel())  # adaptive mode's view of the GPU

    async def start(self) -> None:
        """Start the collector task."""
        self._collector = asyncio.create_task(self._collect(), name="clef-batcher")

    @property
    def pending(self) -> int:
        """Prepared records waiting for a batch."""
        return len(self._ready)

    def submit(self, prepare: Callable[[ItemT], P], items: Sequence[ItemT]) -> asyncio.Future[list[Outcome]]:
        """Schedule `prepare(item)` for each item (one thread-pool call for all of them); returns one future
        for the submission, resolving to one outcome per item, in order (non-blocking).

        A prepare error is that item's outcome; the others still run. Raises `RuntimeError` after `close()`
        began.
        """
        if self._closing:
            raise RuntimeError("batcher is closing")
        loop = asyncio.get_running_loop()
        sub = _Submission(loop.create_future(), len(items))
        if not items:
            sub.future.set_result([])
            return sub.future
        work = loop.run_in_executor(self._prepare_pool, _prepare_all, prepare, items)
        self._track(asyncio.ensure_future(self._admit(work, sub)))
        return sub.future

    async def _admit(self, work: asyncio.Future[list[P | BaseException]], sub: _Submission) -> None:
        try:
            results = await work
        except BaseException:
            sub.future.cancel()  # the pool was shut down under it: nobody waits forever
            raise
        sub.ready_at = self._clock.now()
        ready = self._ready
        for index, result in enumerate(results):
            if isinstance(result, BaseException):
                sub.settle(index, result)
            else:
                ready.append((result, sub, index))
        self._wakeup.set()

    async def _collect(self) -> None:
        slot = False  # a GPU slot is held for the batch being formed, so batches grow while the GPU is busy
        while True:
            if not self._ready:
                if self._closing and not self._tasks:
                    if slot:
                        self._gpu_slots.release()
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if not slot:
                await self._gpu_slots.acquire()
                slot = True
                continue
            count, wait, budget = self._plan()
            if wait > 0 and not self._closing:
                await self._wait(wait)
                continue
            batch = [self._ready.popleft() for _ in range(count)]
            slot = False
            self._cut(batch, budget)

    def _plan(self) -> tuple[int, float, int]:
        """The next batch: (records to cut, seconds to wait first instead (0: cut now), token budget)."""
        cfg, limits = self._settings, self._limits
        head = itertools.islice(self._ready, limits.max_records + 1)
        tokens = [job[0].num_tokens for job in head]
        now = self._clock.now()
        head_age = now - self._ready[0][1].ready_at
        if cfg.mode == "fixed":
            count, full = take(tokens, limits, "packed")
            remaining = cfg.max_wait_ms / 1000.0 - head_age
            return count, (0.0 if full else max(0.0, remaining)), limits.max_tokens
        view = AdaptiveView(head_age=head_age, gpu_free_in=self._queue.free_in(now), lead=self._gpu.lead)
        decision = plan_adaptive(
            tokens,
            view,
            self._queue.cost,
            limits=limits,
            latency_target=cfg.latency_target_ms / 1000.0,
            fallback_wait=cfg.max_wait_ms / 1000.0,
        )
        return decision.count, decision.wait, decision.budget

    def _cut(self, batch: list[_Job[P]], budget: int) -> None:
        """Hand a batch to `_dispatch` and count it as outstanding on the GPU."""
        tokens = sum(job[0].num_tokens for job in batch)
        self._queue.cut(tokens, self._clock.now(), self._gpu.lead)
        if self._metrics is not None:
            self._metrics.batch_fill.observe(min(1.0, tokens / budget))
            self._metrics.batch_budget.set(budget)
        self._track(asyncio.ensure_future(self._dispatch(batch, tokens)))

    def _gpu_done(self, tokens: int, seconds: float, *, learn: bool) -> None:
        """A batch left the GPU thread after `seconds` there (loop only): count the busy time, update the
        GPU view (learning the cost of one clean run), replan."""
        self._queue.done(tokens, seconds, self._clock.now(), learn=learn)
        if self._metrics is not None:
            self._metrics.gpu_busy.inc(seconds)
        self._wakeup.set()

    async def _wait(self, seconds: float) -> None:
        """Sleep until `seconds` pass on the clock or a new record becomes ready."""
        self._wakeup.clear()
        waiter = asyncio.ensure_future(self._wakeup.wait())
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        try:
            await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            sleeper.cancel()

    async def _dispatch(self, batch: list[_Job[P]], tokens: int) -> None:
        started = self._clock.now()
        prepared = [job[0] for job in batch]

        def gpu_done(seconds: float, learn: bool) -> None:  # the GPU slot is free again
            self._gpu_slots.release()
            self._gpu_done(tokens, seconds, learn=learn)

        try:
            result, elapsed = await self._gpu.run(prepared, gpu_done)
        except asyncio.CancelledError:  # `close` gave up on it: its records are unfinished, not failed
            for _, sub, _ in batch:
                sub.future.cancel()
            raise
        except BaseException as exc:  # the GPU thread itself died: fail the whole batch, loudly
            for _, sub, index in batch:
                sub.settle(index, EngineError(DlqReason.engine_failed, exc, 1))
            raise
        failures = 0
        counts: dict[_Submission, int] = {}  # records of each submission in this batch
        for (_, sub, index), outcome in zip(batch, result.outcomes, strict=True):
            if type(outcome) is EngineError:
                failures += 1
            sub.settle(index, outcome)
            counts[sub] = counts.get(sub, 0) + 1
        if self._metrics is not None:
            m = self._metrics
            m.batch_records.observe(len(batch))
            m.batch_tokens.observe(tokens)
            m.engine_seconds.observe(elapsed)
            for sub, count in counts.items():  # records of one submission became ready together
                m.queue_wait.observe(max(0.0, started - sub.ready_at), count)
            if result.stats.splits:
                m.batch_splits.inc(result.stats.splits)
                m.retries.labels(kind="engine_split").inc(result.stats.splits)
        log.info(
            "batch",
            records=len(batch),
            tokens=tokens,
            engine_ms=round(elapsed * 1000, 2),
            calls=result.stats.calls,
            splits=result.stats.splits,
            ooms=result.stats.ooms,
            failed=failures,
        )

    def _track(self, task: asyncio.Future[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._untrack)

    def _untrack(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("batcher_task_failed", error=repr(task.exception()))
        self._wakeup.set()

    async def close(self, timeout_s: float = 30.0) -> None:
        """Flush what is queued without waiting for `max_wait_ms`, finish running batches, stop threads.

        Records still unfinished after `timeout_s` have their futures cancelled.
        """
        self._closing = True
        self._wakeup.set()
        if self._collector is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._collector), timeout_s)
            except TimeoutError:
                self._collector.cancel()
        for _, sub, _ in self._ready:
            sub.future.cancel()
        self._ready.clear()
        # Before the pools go: a task left running would fail on them ("cannot schedule new futures").
        for task in list(self._tasks):
            task.cancel()
        self._prepare_pool.shutdown(wait=False, cancel_futures=True)
        self._gpu.shutdown()


def _prepare_all(prepare: Callable[[ItemT], P], items: Sequence[ItemT]) -> list[P | BaseException]:
    """Prepare every item in a pool thread; an exception is returned in place of its record's result."""
    out: list[P | BaseException] = []
    for item in items:
        try:
            out.append(prepare(item))
        except Exception as exc:
            out.append(exc)
    return out
