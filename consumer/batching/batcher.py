"""Micro-batcher shared by Kafka and HTTP: CPU prepare in a thread pool, one GPU worker thread.

Callers `submit` a run of items with their prepare function (decode + `engine.prepare`, CPU only) and a
priority class; one thread-pool call prepares a submission (urgent classes on the lane's own thread), so
parsing, tokenizing and media decoding overlap the GPU and never block the event loop.

Prepared records wait by class (`consumer.batching.classes`: most urgent first, FIFO inside a class, a
starvation bound). Every batch is cut by the engine's one rule within the engine's limits
(`ServingEngine.limits`, `engine.batching.cut.take`, packed cost; a record over the budget runs alone).
`mode = "fixed"`: flushed when full or `max_wait_ms` after its first record became ready. `mode =
"adaptive"` (default): the size and moment follow the queue and the measured GPU time
(`consumer.batching.adaptive`). At most `max_pending_batches` batches are handed to the GPU thread at once.

Urgent work (classes below `priority.urgent_below`): waiting while the GPU is busy, it is cut into one lane
batch of at most `priority.urgent_max_tokens` that runs between two decoder layers of the running batch
(`GpuRunner.run_urgent`); while the GPU is idle, a batch headed by urgent records is cut at once within
that budget.

Each submission gets one future, resolving to one outcome per item in order (`submission.Outcome`). A cut
batch runs through `consumer.batching.gpu.GpuRunner`: `stage`/`respond` on the prepare threads
(`consumer.batching.cpu_pool`: staging first, then answering, then preparing), `run` on the GPU thread;
a failed batch is split by the engine's one rule (`engine.batching.split`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, Generic, TypeVar

from consumer.batching.adaptive import (
    AdaptiveView,
    CostLike,
    CostModel,
    GpuQueue,
    TimerLateness,
    plan_adaptive,
)
from consumer.batching.batch_metrics import observe_batch, observe_cost
from consumer.batching.classes import ClassPolicy, ClassQueues
from consumer.batching.cpu_pool import JOIN_S, CpuPool, Work
from consumer.batching.gpu import BatchTimes, GpuRunner
from consumer.batching.submission import Job, Outcome, Submission, prepare_all
from consumer.clock import Clock, SystemClock
from consumer.logging import get_logger
from consumer.metrics import Metrics
from consumer.settings import BatchingSettings
from engine.batching.cut import take
from engine.batching.split import EngineError
from engine.types import PreparedLike, ServingEngine
from schemas.errors import DlqReason

__all__ = ["Batcher", "Outcome"]

log = get_logger("consumer.batching.batcher")


P = TypeVar("P", bound=PreparedLike)
S = TypeVar("S")
R = TypeVar("R")
ItemT = TypeVar("ItemT")


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
        priority = settings.priority
        self._urgent_below = priority.urgent_below
        self._urgent_levels = range(min(priority.urgent_below, priority.levels))  # classes of the lane
        self._urgent_limits = self._limits.with_tokens(
            min(self._limits.max_tokens, priority.urgent_max_tokens)
        )
        self._queues: ClassQueues[Job[P]] = ClassQueues(
            ClassPolicy(levels=priority.levels, starvation_batches=priority.starvation_batches)
        )
        self._urgent_busy = False  # an urgent batch is in the lane (one at a time)
        self._wakeup = asyncio.Event()
        self._gpu_slots = asyncio.Semaphore(settings.max_pending_batches)
        self._cpu = CpuPool(settings.prepare_workers, "clef-prepare")  # stage, respond, then prepare
        self._prepare_pool = self._cpu.at(Work.PREPARE)
        stage, reply, ahead = self._cpu.at(Work.STAGE), self._cpu.at(Work.RESPOND), settings.launch_ahead
        self._gpu = GpuRunner(engine, stage, respond_pool=reply, single_attempts=single_attempts, ahead=ahead)
        self._tasks: set[asyncio.Future[Any]] = set()
        self._collector: asyncio.Task[None] | None = None
        self._closing = False
        self._queue = GpuQueue(cost if cost is not None else CostModel())  # adaptive mode's view of the GPU
        self._timer_late = TimerLateness()  # how late the collector's timed waits wake up

    async def start(self) -> None:
        """Start the collector task."""
        self._collector = asyncio.create_task(self._collect(), name="clef-batcher")

    @property
    def pending(self) -> int:
        """Prepared records waiting for a batch."""
        return len(self._queues)

    def submit(
        self, prepare: Callable[[ItemT], P], items: Sequence[ItemT], *, priority: int | None = None
    ) -> asyncio.Future[list[Outcome]]:
        """Schedule `prepare(item)` for each item (one thread-pool call for all of them); returns one future
        for the submission, resolving to one outcome per item, in order (non-blocking). Its records wait in
        priority class `priority` (0 the most urgent; None: `settings.priority.default`).

        A prepare error is that item's outcome; the others still run. Raises `RuntimeError` after `close()`
        began, `ValueError` for a class outside `0..settings.priority.levels - 1`.
        """
        if self._closing:
            raise RuntimeError("batcher is closing")
        levels = self._settings.priority.levels
        level = self._settings.priority.default if priority is None else priority
        if not 0 <= level < levels:
            raise ValueError(f"priority class {level} is outside 0..{levels - 1}")
        loop = asyncio.get_running_loop()
        sub = Submission(loop.create_future(), len(items), level, self._clock.now())
        if not items:
            sub.future.set_result([])
            return sub.future
        pool = self._gpu.urgent_pool if level < self._urgent_below else self._prepare_pool
        work = loop.run_in_executor(pool, prepare_all, prepare, items)
        self._track(asyncio.ensure_future(self._admit(work, sub)))
        return sub.future

    async def _admit(self, work: asyncio.Future[list[P | BaseException]], sub: Submission) -> None:
        try:
            results = await work
        except BaseException:
            sub.future.cancel()  # the pool was shut down under it: nobody waits forever
            raise
        sub.ready_at = self._clock.now()
        if self._metrics is not None:
            self._metrics.prepare_seconds.observe(sub.ready_at - sub.submitted_at, len(results))
        for index, result in enumerate(results):
            if isinstance(result, BaseException):
                sub.settle(index, result)
            else:
                self._queues.push(sub.priority, (result, sub, index))
        self._wakeup.set()

    async def _collect(self) -> None:
        slot = False  # a GPU slot is held for the batch being formed, so batches grow while the GPU is busy
        while True:
            if not self._queues:
                if self._closing and not self._tasks:
                    if slot:
                        self._gpu_slots.release()
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self._urgent_waiting() and self._queue.busy:  # the lane runs it inside the running batch
                if self._urgent_busy:  # one lane batch at a time; it ends within a few decoder layers
                    await self._wait(None)
                else:
                    self._cut_urgent()
                continue
            if not slot:
                if self._gpu_slots.locked():  # every slot taken: wait for one, or for urgent work
                    await self._wait(None)
                    continue
                await self._gpu_slots.acquire()
                slot = True
                continue
            count, wait, budget = self._plan()
            if wait > 0 and not self._closing:
                await self._wait(wait)
                continue
            batch = self._queues.take(count)
            slot = False
            self._cut(batch, budget)

    def _urgent_waiting(self) -> bool:
        """Whether records of an urgent class wait."""
        return any(self._queues.waiting(c) for c in self._urgent_levels)

    def _cut_urgent(self) -> None:
        """Cut the urgent classes' waiting records (class order, FIFO) into one lane batch."""
        head = self._queues.head_of(self._urgent_levels, self._urgent_limits.max_records + 1)
        count, _ = take([job[0].num_tokens for job in head], self._urgent_limits, "packed")
        batch = self._queues.take_from(self._urgent_levels, count)
        tokens = sum(job[0].num_tokens for job in batch)
        self._urgent_busy = True
        self._track(asyncio.ensure_future(self._dispatch(batch, tokens, urgent=True)))

    def _plan(self) -> tuple[int, float, int]:
        """The next batch: (records to cut, seconds to wait first instead (0: cut now), token budget)."""
        cfg, limits = self._settings, self._limits
        offered = self._queues.head(limits.max_records + 1)
        tokens = [job[0].num_tokens for _, job in offered]
        now = self._clock.now()
        head_class, head_job = offered[0]
        head_age = now - head_job[1].ready_at
        if head_class < self._urgent_below:  # urgent work heads the batch: cut now, within the urgent budget
            count, _ = take(tokens, self._urgent_limits, "packed")
            return count, 0.0, self._urgent_limits.max_tokens
        if cfg.mode == "fixed":
            count, full = take(tokens, limits, "packed")
            remaining = cfg.max_wait_ms / 1000.0 - head_age
            return count, (0.0 if full else max(0.0, remaining)), limits.max_tokens
        lead = self._gpu.lead + self._timer_late.value  # a timed cut wakes this late, then stages
        view = AdaptiveView(head_age=head_age, gpu_free_in=self._queue.free_in(now), lead=lead)
        decision = plan_adaptive(
            tokens,
            view,
            self._queue.cost,
            limits=limits,
            latency_target=cfg.latency_target_ms / 1000.0,
            fallback_wait=cfg.max_wait_ms / 1000.0,
            backlog_batches=cfg.backlog_batches,
        )
        return decision.count, decision.wait, decision.budget

    def _cut(self, batch: list[Job[P]], budget: int) -> None:
        """Hand a batch to `_dispatch` and count it as outstanding on the GPU."""
        tokens = sum(job[0].num_tokens for job in batch)
        self._queue.cut(tokens, self._clock.now(), self._gpu.lead)
        if self._metrics is not None:
            self._metrics.batch_fill.observe(min(1.0, tokens / budget))
            self._metrics.batch_budget.set(budget)
        self._track(asyncio.ensure_future(self._dispatch(batch, tokens)))

    def _gpu_done(self, tokens: int, seconds: float, *, learn: bool, ago: float = 0.0) -> None:
        """A batch left the GPU thread after `seconds` there, `ago` seconds before this call (loop only):
        count the busy time and the cost model's error, update the GPU view (learning the cost of a clean
        run; the next batch started on the GPU when this one left it, not when the loop heard), replan."""
        predicted = self._queue.done(tokens, seconds, self._clock.now() - ago, learn=learn)
        if self._metrics is not None:
            self._metrics.gpu_busy.inc(seconds)
            observe_cost(self._metrics, predicted, seconds, learn=learn)
        self._wakeup.set()

    async def _wait(self, seconds: float | None) -> None:
        """Sleep until `seconds` pass on the clock (None: no bound) or the batcher is woken (a record became
        ready, a batch left the GPU, a task ended)."""
        self._wakeup.clear()
        if seconds is None:
            await self._wakeup.wait()
            return
        waiter = asyncio.ensure_future(self._wakeup.wait())
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        began = self._clock.now()
        try:
            await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
            if sleeper.done() and not waiter.done():  # the timer woke it: learn how late timers are
                self._timer_late.observe(seconds, self._clock.now() - began)
        finally:
            waiter.cancel()
            sleeper.cancel()

    async def _dispatch(self, batch: list[Job[P]], tokens: int, *, urgent: bool = False) -> None:
        started = self._clock.now()
        prepared = [job[0] for job in batch]

        def gpu_done(seconds: float, learn: bool, ago: float) -> None:  # the GPU slot is free again
            self._gpu_slots.release()
            self._gpu_done(tokens, seconds, learn=learn, ago=ago)

        times: BatchTimes | None = None  # a normal batch's steps, recorded with it
        steps: dict[str, float | bool] = {}  # its `gpu.BatchTimes` or an urgent one's `gpu.LaneTimes`, logged
        try:
            if urgent:
                try:
                    result, elapsed, lane = await self._gpu.run_urgent(prepared)
                    steps = asdict(lane) if lane is not None else {}
                finally:
                    self._urgent_busy = False
                    self._wakeup.set()
                if self._metrics is not None:
                    self._metrics.gpu_busy.inc(elapsed)
            else:
                result, elapsed, times = await self._gpu.run(prepared, gpu_done)
                steps = asdict(times) if times is not None else {}
        except asyncio.CancelledError:  # `close` gave up on it: its records are unfinished, not failed
            for _, sub, _ in batch:
                sub.future.cancel()
            raise
        except BaseException as exc:  # the GPU thread itself died: fail the whole batch, loudly
            for _, sub, index in batch:
                sub.settle(index, EngineError(DlqReason.engine_failed, exc, 1))
            raise
        failures = 0
        counts: dict[Submission, int] = {}  # records of each submission in this batch
        for (_, sub, index), outcome in zip(batch, result.outcomes, strict=True):
            if type(outcome) is EngineError:
                failures += 1
            sub.settle(index, outcome)
            counts[sub] = counts.get(sub, 0) + 1
        if self._metrics is not None:
            observe_batch(
                self._metrics, counts, result.stats, tokens, elapsed, started, self._clock.now(), times
            )
        log.info(
            "batch",
            urgent=urgent,
            records=len(batch),
            tokens=tokens,
            engine_ms=round(elapsed * 1000, 2),
            calls=result.stats.calls,
            splits=result.stats.splits,
            ooms=result.stats.ooms,
            failed=failures,
            **steps,
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
        """Flush what is queued without waiting for `max_wait_ms`, finish running batches, join threads.

        Records still unfinished after `timeout_s` have their futures cancelled.
        """
        self._closing = True
        self._wakeup.set()
        if self._collector is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._collector), timeout_s)
            except TimeoutError:
                self._collector.cancel()
        for _, sub, _ in self._queues.drain():
            sub.future.cancel()
        # Before the pools go: a task left running would fail on them ("cannot schedule new futures").
        for task in list(self._tasks):
            task.cancel()
        self._cpu.shutdown(wait=False, cancel_futures=True)
        self._gpu.shutdown()
        await asyncio.to_thread(self._cpu.join, JOIN_S)  # here, not while the interpreter finalises
