"""Micro-batcher shared by Kafka and HTTP: CPU prepare in a thread pool, one GPU worker thread.

Callers `submit` prepare thunks (decode + `engine.prepare`, CPU only). Thunks run in a thread pool in chunks,
so JSON parsing, validation, tokenizing and media decoding overlap the GPU and never block the event loop.
Prepared records wait in arrival order; a batch is flushed when it reaches `max_batch_records`, when the next
record would push it over `max_batch_tokens` (a record larger than the budget runs alone), or `max_wait_ms`
after its first record became ready. At most `max_pending_batches` batches are handed to the single GPU
thread at once; the rest wait here (and the pipeline pauses fetching through its in-flight bound).

Each submitted thunk gets a future that resolves to the engine's response, or raises the thunk's own
exception (e.g. `RequestError`) or an `EngineError` when the record failed even alone (see `retry`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from consumer.clock import Clock, SystemClock
from consumer.logging import get_logger
from consumer.metrics import Metrics
from consumer.retry import BatchResult, EngineError, run_split
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


class EngineLike(Protocol[PreparedT]):
    """The two engine calls the service uses (`engine.runner.Engine` satisfies it; tests use fakes).

    `prepare` is CPU only and thread-safe and raises `RequestError` for a permanent problem; `execute` runs
    in the one GPU thread and may raise `torch.OutOfMemoryError`.
    """

    def prepare(self, request: SystemOneRequest) -> PreparedT: ...

    def execute(self, batch: Sequence[PreparedT]) -> list[SystemOneResponse]: ...


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


@dataclass(slots=True)
class _Job(Generic[PreparedT, ResponseT]):
    prepared: PreparedT
    future: asyncio.Future[ResponseT]
    ready_at: float


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
    ) -> None:
        self._execute = execute
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

    def submit(self, thunks: Sequence[Callable[[], PreparedT]]) -> list[asyncio.Future[ResponseT]]:
        """Schedule prepare thunks; returns one future per thunk, in order (non-blocking).

        Raises `RuntimeError` after `close()` began.
        """
        if self._closing:
            raise RuntimeError("batcher is closing")
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[ResponseT]] = [loop.create_future() for _ in thunks]
        step = self._settings.prepare_chunk
        for start in range(0, len(thunks), step):
            chunk = list(thunks[start : start + step])
            work = loop.run_in_executor(self._prepare_pool, _prepare_chunk, chunk)
            self._track(asyncio.ensure_future(self._admit(work, futures[start : start + step])))
        return futures

    async def _admit(
        self,
        work: asyncio.Future[list[PreparedT | BaseException]],
        futures: list[asyncio.Future[ResponseT]],
    ) -> None:
        results = await work
        now = self._clock.now()
        for fut, result in zip(futures, results, strict=True):
            if isinstance(result, BaseException):
                if not fut.done():
                    fut.set_exception(result)
            else:
                self._ready.append(_Job(result, fut, now))
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
                [job.prepared.num_tokens for job in head], cfg.max_batch_records, cfg.max_batch_tokens
            )
            remaining = self._ready[0].ready_at + cfg.max_wait_ms / 1000.0 - self._clock.now()
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
        tokens = sum(job.prepared.num_tokens for job in batch)
        try:
            result, elapsed = await loop.run_in_executor(
                self._gpu_pool, self._run, [job.prepared for job in batch]
            )
        except BaseException as exc:  # the GPU thread itself died: fail the whole batch, loudly
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(EngineError(DlqReason.engine_failed, exc, 1))
            raise
        finally:
            self._gpu_slots.release()
        self.batches += 1
        failures = 0
        for job, outcome in zip(batch, result.outcomes, strict=True):
            if job.future.done():
                continue
            if isinstance(outcome, EngineError):
                failures += 1
                job.future.set_exception(outcome)
            else:
                job.future.set_result(outcome)
        if self._metrics is not None:
            m = self._metrics
            m.batch_records.observe(len(batch))
            m.batch_tokens.observe(tokens)
            m.engine_seconds.observe(elapsed)
            for job in batch:
                m.queue_wait.observe(max(0.0, started - job.ready_at))
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

    def _run(self, batch: list[PreparedT]) -> tuple[BatchResult[ResponseT], float]:
        """GPU thread: execute with splitting; returns the result and the engine time in seconds."""
        t0 = time.perf_counter()
        result = run_split(self._execute, batch, single_attempts=self._single_attempts, on_oom=self._on_oom)
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
        for job in self._ready:
            job.future.cancel()
        self._ready.clear()
        self._prepare_pool.shutdown(wait=False, cancel_futures=True)
        self._gpu_pool.shutdown(wait=False, cancel_futures=True)


def _prepare_chunk(thunks: list[Callable[[], PreparedT]]) -> list[PreparedT | BaseException]:
    """Run prepare thunks in a pool thread; an exception is returned in place of its record's result."""
    out: list[PreparedT | BaseException] = []
    for thunk in thunks:
        try:
            out.append(thunk())
        except Exception as exc:
            out.append(exc)
    return out
