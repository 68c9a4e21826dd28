"""Micro-batcher shared by Kafka and HTTP: CPU prepare in a thread pool, one GPU worker thread.

Callers `submit` a run of items with their prepare function (decode + `engine.prepare`, CPU only). Each
submission is prepared by one call in a thread pool, so JSON parsing, validation, tokenizing and media
decoding overlap the GPU and never block the event loop.
Prepared records wait in arrival order. With `mode = "fixed"` a batch is flushed when it reaches
`max_batch_records`, when the next record would push it over `max_batch_tokens` (a record larger than the
budget runs alone), or `max_wait_ms` after its first record became ready. With `mode = "adaptive"` (the
default) the size and the moment follow the queue and the GPU time measured per batch (`consumer.adaptive`):
at once while the GPU is idle, just before it frees up while it is busy, within a budget derived from
`latency_target_ms` unless a backlog built, always within `max_batch_records` and `max_batch_tokens`.
At most `max_pending_batches` batches are handed to the single GPU thread at once; the rest wait
here (and the pipeline pauses fetching through its in-flight bound).

Each submission gets one future that resolves to one outcome per item, in order: the engine's response, the
prepare call's own exception (e.g. `RequestError`), or an `EngineError` when the record failed even alone
(see `retry`). One future per run of records, not per record: the service submits a fetched run at a time.

With `stages` (an engine's `stage`/`run`/`respond`, see `engine.types.ServingEngine`), only `run` occupies
the GPU thread: a batch is staged (collated, copied to the device) in the prepare pool while the previous
batch is still on the GPU, and answered there after its run, while the next batch runs. A batch whose
staged run fails in any way is run again through `execute` with splitting (`engine.split.run_split`, the
engine's one splitting rule; the engine's `out_of_memory` tells an OOM apart and frees the cache).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from consumer.adaptive import AdaptiveView, CostLike, CostModel, plan_adaptive, plan_next
from consumer.clock import Clock, SystemClock
from consumer.logging import get_logger
from consumer.metrics import Metrics
from consumer.settings import BatchingSettings
from engine.split import BatchResult, EngineError, SplitStats, never_out_of_memory, run_split
from engine.types import PreparedLike
from schemas.errors import DlqReason

__all__ = ["Batcher", "StagedCalls", "plan_next"]

log = get_logger("consumer.batcher")


PreparedT = TypeVar("PreparedT", bound=PreparedLike)
ResponseT = TypeVar("ResponseT")
ItemT = TypeVar("ItemT")


@dataclass(frozen=True, slots=True)
class StagedCalls(Generic[PreparedT, ResponseT]):
    """An engine's three-step execute: `stage` (any thread) -> `run` (the GPU thread) -> `respond` (any
    thread); `respond(run(stage(batch)))` must equal `execute(batch)`."""

    stage: Callable[[Sequence[PreparedT]], Any]
    run: Callable[[Any], Any]
    respond: Callable[[Any], list[ResponseT]]


class _Submission(Generic[ResponseT]):
    """One `submit` call: its outcomes, how many are still missing, its future, when it became ready."""

    __slots__ = ("future", "left", "outcomes", "ready_at")

    def __init__(self, future: asyncio.Future[list[ResponseT | BaseException]], size: int) -> None:
        self.future = future
        self.outcomes: list[ResponseT | BaseException | None] = [None] * size
        self.left = size
        self.ready_at = 0.0

    def settle(self, index: int, outcome: ResponseT | BaseException) -> None:
        """Store one outcome; resolves the future with every outcome once the last one arrives."""
        self.outcomes[index] = outcome
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(cast("list[ResponseT | BaseException]", self.outcomes))


# A prepared record waiting for its batch: (prepared, its submission, its index in the submission).
_Job = tuple[PreparedT, _Submission[ResponseT], int]


class Batcher(Generic[PreparedT, ResponseT]):
    """See the module docstring. Start with `start()`, stop with `close()`; all methods run on the loop."""

    def __init__(
        self,
        execute: Callable[[Sequence[PreparedT]], list[ResponseT]],
        settings: BatchingSettings,
        *,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        single_attempts: int = 2,
        out_of_memory: Callable[[BaseException], bool] = never_out_of_memory,
        stages: StagedCalls[PreparedT, ResponseT] | None = None,
        cost: CostLike | None = None,
    ) -> None:
        self._execute = execute
        self._stages = stages
        self._settings = settings
        self._clock = clock or SystemClock()
        self._metrics = metrics
        self._single_attempts = single_attempts
        self._out_of_memory = out_of_memory
        self._ready: deque[_Job[PreparedT, ResponseT]] = deque()
        self._wakeup = asyncio.Event()
        self._gpu_slots = asyncio.Semaphore(settings.max_pending_batches)
        self._prepare_pool = ThreadPoolExecutor(settings.prepare_workers, thread_name_prefix="clef-prepare")
        self._gpu_pool = ThreadPoolExecutor(1, thread_name_prefix="clef-gpu")
        self._tasks: set[asyncio.Future[Any]] = set()
        self._collector: asyncio.Task[None] | None = None
        self._closing = False
        # Adaptive mode's view of the GPU (written on the loop only): the cost model, the tokens of every
        # batch cut and not yet off the GPU (FIFO: one GPU thread), when the GPU last started on the first
        # of them, and how long staging takes (exponential average).
        self._cost: CostLike = cost if cost is not None else CostModel()
        self._outstanding: deque[int] = deque()
        self._gpu_mark = 0.0
        self._lead = 0.0

    async def start(self) -> None:
        """Start the collector task."""
        self._collector = asyncio.create_task(self._collect(), name="clef-batcher")

    @property
    def pending(self) -> int:
        """Prepared records waiting for a batch."""
        return len(self._ready)

    def submit(
        self, prepare: Callable[[ItemT], PreparedT], items: Sequence[ItemT]
    ) -> asyncio.Future[list[ResponseT | BaseException]]:
        """Schedule `prepare(item)` for each item (one thread-pool call for all of them); returns one future
        for the submission, resolving to one outcome per item, in order (non-blocking).

        A prepare error is that item's outcome; the others still run. Raises `RuntimeError` after `close()`
        began.
        """
        if self._closing:
            raise RuntimeError("batcher is closing")
        loop = asyncio.get_running_loop()
        sub: _Submission[ResponseT] = _Submission(loop.create_future(), len(items))
        if not items:
            sub.future.set_result([])
            return sub.future
        work = loop.run_in_executor(self._prepare_pool, _prepare_all, prepare, items)
        self._track(asyncio.ensure_future(self._admit(work, sub)))
        return sub.future

    async def _admit(
        self, work: asyncio.Future[list[PreparedT | BaseException]], sub: _Submission[ResponseT]
    ) -> None:
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
        cfg = self._settings
        head = itertools.islice(self._ready, cfg.max_batch_records + 1)
        tokens = [job[0].num_tokens for job in head]
        now = self._clock.now()
        head_age = now - self._ready[0][1].ready_at
        if cfg.mode == "fixed":
            count, full = plan_next(tokens, cfg.max_batch_records, cfg.max_batch_tokens)
            remaining = cfg.max_wait_ms / 1000.0 - head_age
            return count, (0.0 if full else max(0.0, remaining)), cfg.max_batch_tokens
        view = AdaptiveView(head_age=head_age, gpu_free_in=self._gpu_free_in(now), lead=self._lead)
        decision = plan_adaptive(
            tokens,
            view,
            self._cost,
            max_records=cfg.max_batch_records,
            max_tokens=cfg.max_batch_tokens,
            latency_target=cfg.latency_target_ms / 1000.0,
            fallback_wait=cfg.max_wait_ms / 1000.0,
        )
        return decision.count, decision.wait, decision.budget

    def _gpu_free_in(self, now: float) -> float:
        """Predicted seconds until the GPU has run every batch cut so far (0 when none is outstanding or
        the cost model cannot tell yet)."""
        if not self._outstanding:
            return 0.0
        predicted = 0.0
        for tokens in self._outstanding:
            seconds = self._cost.predict(tokens)
            if seconds is None:
                return 0.0
            predicted += seconds
        return max(0.0, self._gpu_mark + predicted - now)

    def _cut(self, batch: list[_Job[PreparedT, ResponseT]], budget: int) -> None:
        """Hand a batch to `_dispatch` and count it as outstanding on the GPU."""
        tokens = sum(job[0].num_tokens for job in batch)
        if not self._outstanding:  # the GPU is idle: it starts on this batch once it is staged
            self._gpu_mark = self._clock.now() + self._lead
        self._outstanding.append(tokens)
        if self._metrics is not None:
            self._metrics.batch_fill.observe(min(1.0, tokens / budget))
            self._metrics.batch_budget.set(budget)
        self._track(asyncio.ensure_future(self._dispatch(batch, tokens)))

    def _gpu_done(self, tokens: int, seconds: float, *, learn: bool) -> None:
        """A batch left the GPU thread after `seconds` there (loop only): count the busy time, learn the
        batch's cost when `learn` (one clean run), start the clock on the next batch, replan."""
        self._outstanding.popleft()
        self._gpu_mark = self._clock.now()
        if learn:
            self._cost.observe(tokens, seconds)
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

    async def _dispatch(self, batch: list[_Job[PreparedT, ResponseT]], tokens: int) -> None:
        loop = asyncio.get_running_loop()
        started = self._clock.now()
        prepared = [job[0] for job in batch]
        try:
            result, elapsed = await self._execute_batch(loop, prepared, tokens)
        except asyncio.CancelledError:  # `close` gave up on it: its records are unfinished, not failed
            for _, sub, _ in batch:
                sub.future.cancel()
            raise
        except BaseException as exc:  # the GPU thread itself died: fail the whole batch, loudly
            for _, sub, index in batch:
                sub.settle(index, EngineError(DlqReason.engine_failed, exc, 1))
            raise
        failures = 0
        counts: dict[_Submission[ResponseT], int] = {}  # records of each submission in this batch
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

    async def _execute_batch(
        self, loop: asyncio.AbstractEventLoop, prepared: list[PreparedT], tokens: int
    ) -> tuple[BatchResult[ResponseT], float]:
        """Staged when the engine offers it (the GPU slot is given back as soon as the run ends), else, or
        after any failure of the staged attempt, `execute` with splitting in the GPU thread."""
        released = False

        def release(seconds: float = 0.0, *, learn: bool = False) -> None:
            nonlocal released
            if not released:
                released = True
                self._gpu_slots.release()
                self._gpu_done(tokens, seconds, learn=learn)

        try:
            failed: Exception | None = None
            stages = self._stages
            if stages is not None:
                try:
                    staged, stage_s = await loop.run_in_executor(
                        self._prepare_pool, _timed, stages.stage, prepared
                    )
                    self._lead += 0.2 * (stage_s - self._lead)
                    raw, elapsed = await loop.run_in_executor(self._gpu_pool, _timed, stages.run, staged)
                    release(elapsed, learn=True)
                    responses = await loop.run_in_executor(self._prepare_pool, stages.respond, raw)
                    if len(responses) != len(prepared):
                        raise RuntimeError(f"engine returned {len(responses)} results for {len(prepared)}")
                    return BatchResult(list(responses), SplitStats(calls=1)), elapsed
                except Exception as exc:  # split from here on: the whole batch is not run again
                    log.warning("staged_batch_failed", records=len(prepared), error=type(exc).__name__)
                    failed = exc
            result, elapsed = await loop.run_in_executor(self._gpu_pool, self._run, prepared, failed)
            # a split run's time is not one batch's cost: keep it out of the model
            release(elapsed, learn=failed is None and result.stats.calls == 1)
            return result, elapsed
        finally:
            release()

    def _run(
        self, batch: list[PreparedT], failed: Exception | None = None
    ) -> tuple[BatchResult[ResponseT], float]:
        """GPU thread: execute with splitting (starting from the failure of a staged attempt, when given);
        returns the result and the engine time in seconds."""
        t0 = time.perf_counter()
        result = run_split(
            self._execute,
            batch,
            single_attempts=self._single_attempts,
            out_of_memory=self._out_of_memory,
            failed=failed,
        )
        return result, time.perf_counter() - t0

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
        self._gpu_pool.shutdown(wait=False, cancel_futures=True)


def _timed(fn: Callable[[Any], Any], arg: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(arg)
    return out, time.perf_counter() - t0


def _prepare_all(
    prepare: Callable[[ItemT], PreparedT], items: Sequence[ItemT]
) -> list[PreparedT | BaseException]:
    """Prepare every item in a pool thread; an exception is returned in place of its record's result."""
    out: list[PreparedT | BaseException] = []
    for item in items:
        try:
            out.append(prepare(item))
        except Exception as exc:
            out.append(exc)
    return out
