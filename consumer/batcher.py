"""Micro-batcher shared by Kafka and HTTP: CPU prepare in a thread pool, one GPU worker thread.

Callers `submit` a run of items with their prepare function (decode + `engine.prepare`, CPU only). Each
submission is prepared by one call in a thread pool, so JSON parsing, validation, tokenizing and media
decoding overlap the GPU and never block the event loop.
Prepared records wait in arrival order; a batch is flushed when it reaches `max_batch_records`, when the next
record would push it over `max_batch_tokens` (a record larger than the budget runs alone), or `max_wait_ms`
after its first record became ready. At most `max_pending_batches` batches are handed to the single GPU
thread at once; the rest wait here (and the pipeline pauses fetching through its in-flight bound).

Each submission gets one future that resolves to one outcome per item, in order: the engine's response, the
prepare call's own exception (e.g. `RequestError`), or an `EngineError` when the record failed even alone
(see `retry`). One future per run of records, not per record: the service submits a fetched run at a time.

With `stages` (an engine's `stage`/`run`/`respond`, see `engine.runner.Engine`), only `run` occupies the
GPU thread: a batch is staged (collated, copied to the device) in the prepare pool while the previous
batch is still on the GPU, and answered there after its run, while the next batch runs. A batch whose
staged run fails in any way is run again through `execute` with splitting (`retry.run_split`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

from consumer.clock import Clock, SystemClock
from consumer.logging import get_logger
from consumer.metrics import Metrics
from consumer.retry import BatchResult, EngineError, SplitStats, run_split
from consumer.settings import BatchingSettings
from schemas.errors import DlqReason

if TYPE_CHECKING:
    from schemas.systemone import SystemOneRequest, SystemOneResponse

log = get_logger("consumer.batcher")


class PreparedLike(Protocol):
    """What the batcher needs from a prepared record: its token count."""

    @property
    def num_tokens(self) -> int: ...


PreparedT = TypeVar("PreparedT", bound=PreparedLike)
ResponseT = TypeVar("ResponseT")
ItemT = TypeVar("ItemT")


class EngineLike(Protocol[PreparedT]):
    """The two engine calls the service uses (`engine.runner.Engine` satisfies it; tests use fakes).

    `prepare` is CPU only and thread-safe and raises `RequestError` for a permanent problem; `execute` runs
    in the one GPU thread and may raise `torch.OutOfMemoryError`.
    """

    def prepare(self, request: SystemOneRequest) -> PreparedT: ...

    def execute(self, batch: Sequence[PreparedT]) -> list[SystemOneResponse]: ...


@dataclass(frozen=True, slots=True)
class StagedCalls(Generic[PreparedT, ResponseT]):
    """An engine's three-step execute: `stage` (any thread) -> `run` (the GPU thread) -> `respond` (any
    thread); `respond(run(stage(batch)))` must equal `execute(batch)`."""

    stage: Callable[[Sequence[PreparedT]], Any]
    run: Callable[[Any], Any]
    respond: Callable[[Any], list[ResponseT]]


def staged_calls(engine: object) -> StagedCalls[Any, Any] | None:
    """`StagedCalls` of an engine that offers `stage`, `run` and `respond`; None for one that does not."""
    stage, run, respond = (getattr(engine, name, None) for name in ("stage", "run", "respond"))
    if callable(stage) and callable(run) and callable(respond):
        return StagedCalls(stage, run, respond)
    return None


def plan_next(tokens: Sequence[int], max_records: int, max_tokens: int) -> tuple[int, bool]:
    """How many leading records form the next batch, and whether that batch is full already.

    Full means a limit is reached: `max_records` records, the token budget exactly used, or the next
    record not fitting. The first record always fits (alone if larger than the budget). Pure.
    """
    count = 0
    used = 0
    for size in tokens:
        if count == max_records:
            return count, True
        if count > 0 and used + size > max_tokens:
            return count, True
        count += 1
        used += size
        if used >= max_tokens:
            return count, True
    return count, count >= max_records


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
        on_oom: Callable[[], None] | None = None,
        stages: StagedCalls[PreparedT, ResponseT] | None = None,
    ) -> None:
        self._execute = execute
        self._stages = stages
        self._settings = settings
        self._clock = clock or SystemClock()
        self._metrics = metrics
        self._single_attempts = single_attempts
        self._on_oom = on_oom
        self._ready: deque[_Job[PreparedT, ResponseT]] = deque()
        self._wakeup = asyncio.Event()
        self._gpu_slots = asyncio.Semaphore(settings.max_pending_batches)
        self._prepare_pool = ThreadPoolExecutor(settings.prepare_workers, thread_name_prefix="clef-prepare")
        self._gpu_pool = ThreadPoolExecutor(1, thread_name_prefix="clef-gpu")
        self._tasks: set[asyncio.Future[Any]] = set()
        self._collector: asyncio.Task[None] | None = None
        self._closing = False
        self.batches = 0

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
        cfg = self._settings
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
            head = itertools.islice(self._ready, cfg.max_batch_records + 1)
            count, full = plan_next(
                [job[0].num_tokens for job in head], cfg.max_batch_records, cfg.max_batch_tokens
            )
            remaining = self._ready[0][1].ready_at + cfg.max_wait_ms / 1000.0 - self._clock.now()
            if not full and remaining > 0 and not self._closing:
                await self._wait(remaining)
                continue
            batch = [self._ready.popleft() for _ in range(count)]
            slot = False
            self._track(asyncio.ensure_future(self._dispatch(batch)))

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

    async def _dispatch(self, batch: list[_Job[PreparedT, ResponseT]]) -> None:
        loop = asyncio.get_running_loop()
        started = self._clock.now()
        prepared = [job[0] for job in batch]
        tokens = sum(p.num_tokens for p in prepared)
        try:
            result, elapsed = await self._execute_batch(loop, prepared)
        except asyncio.CancelledError:  # `close` gave up on it: its records are unfinished, not failed
            for _, sub, _ in batch:
                sub.future.cancel()
            raise
        except BaseException as exc:  # the GPU thread itself died: fail the whole batch, loudly
            for _, sub, index in batch:
                sub.settle(index, EngineError(DlqReason.engine_failed, exc, 1))
            raise
        self.batches += 1
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
        self, loop: asyncio.AbstractEventLoop, prepared: list[PreparedT]
    ) -> tuple[BatchResult[ResponseT], float]:
        """Staged when the engine offers it (the GPU slot is given back as soon as the run ends), else, or
        after any failure of the staged attempt, `execute` with splitting in the GPU thread."""
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._gpu_slots.release()

        try:
            failed: Exception | None = None
            stages = self._stages
            if stages is not None:
                try:
                    staged = await loop.run_in_executor(self._prepare_pool, stages.stage, prepared)
                    raw, elapsed = await loop.run_in_executor(self._gpu_pool, _timed, stages.run, staged)
                    release()
                    responses = await loop.run_in_executor(self._prepare_pool, stages.respond, raw)
                    if len(responses) != len(prepared):
                        raise RuntimeError(f"engine returned {len(responses)} results for {len(prepared)}")
                    return BatchResult(list(responses), SplitStats(calls=1)), elapsed
                except Exception as exc:  # split from here on: the whole batch is not run again
                    log.warning("staged_batch_failed", records=len(prepared), error=type(exc).__name__)
                    failed = exc
            return await loop.run_in_executor(self._gpu_pool, self._run, prepared, failed)
        finally:
            release()

    def _run(
        self, batch: list[PreparedT], failed: Exception | None = None
    ) -> tuple[BatchResult[ResponseT], float]:
        """GPU thread: execute with splitting (starting from the failure of a staged attempt, when given);
        returns the result and the engine time in seconds."""
        t0 = time.perf_counter()
        result = run_split(
            self._execute, batch, single_attempts=self._single_attempts, on_oom=self._on_oom, failed=failed
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
