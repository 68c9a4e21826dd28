"""The engine end of the batcher: runs one cut batch, with only GPU work on the one GPU thread.

The engine is an `engine.types.ServingEngine`: a batch is staged (collated, copied to the device) on a
prepare thread while the previous batch is still on the GPU and queued on the GPU thread from there (no hop
through the event loop between), run on the GPU thread, and answered on a prepare thread while the next
batch runs (the batcher's `consumer.batching.cpu_pool.CpuPool` takes staging ahead of answering, and both
ahead of preparing records). The batcher cuts a batch `lead` before the GPU frees up: the measured time
from a cut until its run is queued (`bench.batcher_model`; BENCHMARKS.md, "Priority classes, round
six"). A batch whose staged run fails in any way goes through the engine's `execute` with splitting on the
GPU thread (`engine.batching.split.run_split`: the engine's one splitting rule; its `out_of_memory` tells
an OOM apart and frees the cache).

Urgent lane (`run_urgent`): an urgent batch is staged on a thread of its own and queued in the lane, its
stage and its run inside the engine's `lane()` (on CUDA a high-priority stream, so neither queues behind the
running batch's launched layers); the GPU thread runs it at the next step boundary of the batch it is
running (the engine calls the lane's drain as its `between` hook, between decoder layers; a batch that
replays CUDA graphs, up to 8,192 tokens, has no such boundary, so the lane batch runs right after it, ahead
of the next bulk batch even when that one was already queued on the GPU thread), or, when no batch is
running, as its next task. Each lane batch runs exactly once, whichever comes first. Lane
work inside a running batch is bounded by time, not count: at a step boundary a lane batch goes in while the
lane's time inside that batch is at most `URGENT_SHARE` of the batch's wall time so far (the first always
goes in), so a bulk batch is stretched at most 1 / (1 - share) times and an urgent batch waits a few
steps, never the rest of the batch. The time a lane batch took inside a normal batch is taken out of that
batch's GPU time, and that batch is not learnt from.

Launching ahead (`ahead`, `batching.launch_ahead`): the GPU thread only queues a batch's device work
(`ServingEngine.launch`) and a thread of its own (`clef-gpu-wait`) waits for it (`Launched.wait`), so a
batch staged while the one before it runs is launched at once, and the device goes from one to the next
without the host's sync, hand-back and first launches in between. A batch's GPU time is then the engine's
device seconds (from when the device started it), or the wall time from its launch where the engine gives
none; its `gpu_wait` counts the wait on the device queue too. Only a batch the engine queues whole
(`ServingEngine.queues_whole`: CUDA graph replays) is launched ahead; one it runs step by step (eager layers
paced to the device, up to the token budget's large batches) first waits for the batches launched before it
and runs as without launching ahead, so the lane still gets in at its step boundaries instead of behind the
remainder of a batch ahead, and its time is not spent waiting inside a launch. Without it, the GPU thread
waits for each batch before it takes the next, and a batch's GPU time is that wait's wall time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from consumer.batching.gpu_times import BATCH_STEPS, BatchRun, BatchTimes, LaneTimes
from consumer.logging import get_logger
from engine.batching.split import BatchResult, SplitStats, run_split
from engine.types import Launched, PreparedLike, ServingEngine
from schemas.response import SystemOneResponse

__all__ = ["BATCH_STEPS", "URGENT_SHARE", "BatchTimes", "GpuDone", "GpuRunner", "LaneTimes"]

log = get_logger("consumer.batching.batcher")

P = TypeVar("P", bound=PreparedLike)
S = TypeVar("S")
R = TypeVar("R")


@dataclass(eq=False, slots=True)
class _LaneBatch(Generic[S, R]):
    """A staged urgent batch waiting in the lane, and the future its run settles (GPU thread)."""

    staged: S
    queued: float  # perf_counter time it entered the lane (event loop)
    done: Future[tuple[R, float]] = field(default_factory=Future)
    started: float = 0.0  # perf_counter time its run began (GPU thread, before `done` is settled)
    inside: bool = False  # whether it ran inside a running batch (GPU thread, as `started`)


URGENT_SHARE = 0.5
"""The most of a running batch's wall time the lane may take inside it (see the module docstring): urgent
work at most doubles a bulk batch, and a flood of it still leaves bulk half of the GPU."""

GpuDone = Callable[[float, bool, float], None]
"""Called once per batch when it left the GPU thread: (seconds it ran there, whether that is one clean run
the cost model may learn from, seconds since it left: the hand-back to the event loop took that long, and
the GPU started on the next queued batch that long ago)."""


class GpuRunner(Generic[P, S, R]):
    """Runs batches of `engine` on one GPU thread and one urgent thread (its own) and the caller's CPU
    pools: `cpu_pool` stages, `respond_pool` (default `cpu_pool`) answers. Event loop only."""

    def __init__(
        self,
        engine: ServingEngine[P, S, R],
        cpu_pool: Executor,
        *,
        respond_pool: Executor | None = None,
        single_attempts: int = 2,
        ahead: bool = False,
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._engine = engine
        self._now = now  # the GPU thread's clock of the lane's bound (tests pass a scripted one)
        self._cpu_pool = cpu_pool  # stages (the batcher's `CpuPool` at `Work.STAGE`)
        self._respond_pool = cpu_pool if respond_pool is None else respond_pool
        self._single_attempts = single_attempts
        self._gpu_pool = ThreadPoolExecutor(1, thread_name_prefix="clef-gpu")
        self._urgent_pool = ThreadPoolExecutor(1, thread_name_prefix="clef-urgent")
        self._launch_ahead = ahead  # `ahead`: launch ahead (see the module docstring)
        self._wait_pool = ThreadPoolExecutor(1, thread_name_prefix="clef-gpu-wait")  # launch-ahead's waits
        self._last_launched: Future[BatchRun[R]] | None = None  # GPU thread only: the last launch's wait
        self._lane: deque[_LaneBatch[S, R]] = deque()
        self._lane_lock = threading.Lock()
        self._lane_seconds = 0.0  # GPU thread only: lane time spent so far
        self._batch_began: float | None = None  # GPU thread only: when the running batch began (None: none)
        self._batch_lane0 = 0.0  # GPU thread only: `_lane_seconds` when the running batch began
        self.lead = 0.0  # seconds from a cut until its run is queued on the GPU thread (exponential average)

    @property
    def lane_waiting(self) -> int:
        """Staged urgent batches waiting in the lane for their run."""
        with self._lane_lock:
            return len(self._lane)

    @property
    def urgent_pool(self) -> Executor:
        """The urgent lane's CPU thread: urgent prepare, stage and respond never queue behind bulk work."""
        return self._urgent_pool

    async def run(
        self, prepared: list[P], on_done: GpuDone
    ) -> tuple[BatchResult[SystemOneResponse], float, BatchTimes | None]:
        """Run `prepared` as one batch; returns its outcomes, its GPU seconds and where its time went (None
        when it failed and was split). `on_done` is called once, as soon as the batch left the GPU thread
        (before `respond`), or at the end if it never got there. Never raises for an engine error (a record
        failing alone is an `EngineError` outcome)."""
        loop = asyncio.get_running_loop()
        engine = self._engine
        done = False

        def release(seconds: float = 0.0, learn: bool = False, ended: float | None = None) -> None:
            nonlocal done
            if not done:
                done = True
                on_done(seconds, learn, 0.0 if ended is None else max(0.0, time.perf_counter() - ended))

        try:
            try:
                cut = time.perf_counter()
                queued, staging, at = await loop.run_in_executor(
                    self._cpu_pool, self._stage_and_queue, prepared
                )
                self.lead += 0.2 * (at - cut - self.lead)  # from the cut until the GPU thread could start it
                waiting: Future[BatchRun[R]] = await asyncio.wrap_future(queued)
                ran = await asyncio.wrap_future(waiting)
                raw, elapsed, began, ended = ran.raw, ran.seconds, ran.began, ran.ended
                back = time.perf_counter()
                release(elapsed, ran.clean, ended)
                responses, answering = await loop.run_in_executor(self._respond_pool, _respond, engine, raw)
                if len(responses) != len(prepared):
                    raise RuntimeError(f"engine returned {len(responses)} results for {len(prepared)}")
                times = BatchTimes(
                    stage_wait_ms=_ms(max(0.0, staging - cut)),
                    stage_ms=_ms(at - max(cut, staging)),
                    gpu_wait_ms=_ms(max(0.0, began - at) + max(0.0, ended - began - ran.run_s)),
                    run_ms=_ms(ran.run_s),
                    back_ms=_ms(max(0.0, back - ended)),
                    respond_wait_ms=_ms(max(0.0, answering - back)),
                    respond_ms=_ms(time.perf_counter() - max(back, answering)),
                )
                return BatchResult(list(responses), SplitStats(calls=1)), elapsed, times
            except Exception as exc:  # split from here on: the whole batch is not run again
                log.warning("staged_batch_failed", records=len(prepared), error=type(exc).__name__)
                failed = exc
            result, elapsed = await loop.run_in_executor(self._gpu_pool, self._split, prepared, failed)
            release(elapsed, False)  # a split run's time is not one batch's cost: keep it out of the model
            return result, elapsed, None
        finally:
            release()

    async def run_urgent(
        self, prepared: list[P]
    ) -> tuple[BatchResult[SystemOneResponse], float, LaneTimes | None]:
        """Run `prepared` as one urgent batch through the lane (see the module docstring); returns its
        outcomes, GPU seconds and where its time went (None when it failed and was split: a failed lane
        run is split on the GPU thread like any batch). Never raises for an engine error."""
        loop = asyncio.get_running_loop()
        engine = self._engine
        try:
            t0 = time.perf_counter()
            staged = await loop.run_in_executor(self._urgent_pool, self._stage_in_lane, prepared)
            item: _LaneBatch[S, R] = _LaneBatch(staged, time.perf_counter())
            with self._lane_lock:
                self._lane.append(item)
            self._gpu_pool.submit(self._drain_lane)  # in case no running batch reaches a step boundary
            raw, elapsed = await asyncio.wrap_future(item.done)
            answered = time.perf_counter()
            responses = await loop.run_in_executor(self._urgent_pool, engine.respond, raw)
            if len(responses) != len(prepared):
                raise RuntimeError(f"engine returned {len(responses)} results for {len(prepared)}")
            times = LaneTimes(
                stage_ms=_ms(item.queued - t0),
                lane_wait_ms=_ms(item.started - item.queued),
                run_ms=_ms(elapsed),
                settle_ms=_ms(answered - item.started - elapsed),
                respond_ms=_ms(time.perf_counter() - answered),
                inside=item.inside,
            )
            return BatchResult(list(responses), SplitStats(calls=1)), elapsed, times
        except Exception as exc:
            log.warning("urgent_batch_failed", records=len(prepared), error=type(exc).__name__)
            result, elapsed = await loop.run_in_executor(self._gpu_pool, self._split, prepared, exc)
            return result, elapsed, None

    def _stage_in_lane(self, prepared: list[P]) -> S:
        """Urgent thread: stage an urgent batch inside the engine's lane (its copies on the lane's stream)."""
        with self._engine.lane():
            return self._engine.stage(prepared)

    def _stage_and_queue(self, prepared: list[P]) -> tuple[Future[Future[BatchRun[R]]], float, float]:
        """CPU pool: stage a batch and queue its run on the GPU thread straight from here (no hop through
        the event loop in between); returns the run's future, when staging began and when the run was
        queued (`perf_counter`)."""
        staging = time.perf_counter()
        staged = self._engine.stage(prepared)
        return self._gpu_pool.submit(self._run_normal, staged), staging, time.perf_counter()

    def _run_normal(self, staged: S) -> Future[BatchRun[R]]:
        """GPU thread: run one batch with the lane as its `between` hook (`ServingEngine.run`, blocking), or,
        when launching ahead and the engine queues it whole (`queues_whole`), launch it (`launch`) and leave
        its wait to the wait thread (`_wait_launched`); returns the future of its `BatchRun`. The lane batches
        waiting when it comes up run first (those only: a flood of urgent work cannot hold it back), so an
        urgent batch staged while the batch before ran waits for that one alone, not for this one too (its
        own drain task is queued behind this batch). When launching ahead, a batch run step by step first
        waits for the batches launched ahead of it, so its `between` boundaries are not behind their
        remainder."""
        ahead = self._launch_ahead and self._engine.queues_whole(staged)
        if self._launch_ahead and not ahead and self._last_launched is not None:
            futures_wait([self._last_launched])  # its outcome is its own run's to report
        self._drain_lane(limit=self.lane_waiting)
        began = time.perf_counter()
        lane0 = self._batch_lane0 = self._lane_seconds
        t0 = self._batch_began = self._now()
        launched: Launched[R] | None = None
        try:
            if ahead:
                launched = self._engine.launch(staged, self._between)
            else:
                raw = self._engine.run(staged, self._between)
        finally:
            self._batch_began = None
        lane = self._lane_seconds - lane0
        if launched is not None:
            waiting = self._wait_pool.submit(self._wait_launched, launched, began, t0, lane)
            self._last_launched = waiting
            return waiting
        wall, ended = self._now() - t0, time.perf_counter()
        done: Future[BatchRun[R]] = Future()
        done.set_result(BatchRun(raw, wall - lane, lane == 0.0, began, ended, ended - began))
        return done

    def _wait_launched(self, launched: Launched[R], began: float, t0: float, lane: float) -> BatchRun[R]:
        """Wait thread: wait for a batch launched ahead; its own time is the engine's device seconds (wall
        time since its launch where the engine gives none), with `lane` seconds of lane work taken out."""
        raw, device = launched.wait()
        own = device if device is not None else self._now() - t0
        return BatchRun(raw, max(0.0, own - lane), lane == 0.0, began, time.perf_counter(), own)

    def _between(self) -> None:
        """GPU thread, the running batch's `between` hook: the lane's waiting batches while the lane's
        time inside this batch is at most `URGENT_SHARE` of its wall time so far (the first always)."""
        began = self._batch_began
        while began is not None and self._lane:
            inside = self._lane_seconds - self._batch_lane0
            if inside > 0.0 and inside > URGENT_SHARE * (self._now() - began):
                return  # the next boundaries let it in, once the bulk work caught up
            self._drain_lane(limit=1, inside=True)

    def _drain_lane(self, limit: int | None = None, *, inside: bool = False) -> None:
        """GPU thread: run staged urgent batches waiting in the lane (all, or at most `limit`), each once,
        settling its future."""
        ran = 0
        while limit is None or ran < limit:
            with self._lane_lock:
                if not self._lane:
                    return
                item = self._lane.popleft()
            ran += 1
            item.started = time.perf_counter()
            item.inside = inside
            t0 = self._now()
            try:
                with self._engine.lane():  # where it was staged: not behind the running batch's layers
                    raw = self._engine.run(item.staged)
            except BaseException as exc:
                item.done.set_exception(exc)
            else:
                item.done.set_result((raw, self._now() - t0))
            finally:
                self._lane_seconds += self._now() - t0

    def shutdown(self) -> None:
        """Stop the GPU thread (a batch running finishes there; nothing new starts)."""
        self._gpu_pool.shutdown(wait=False, cancel_futures=True)
        self._wait_pool.shutdown(wait=False, cancel_futures=True)
        self._urgent_pool.shutdown(wait=False, cancel_futures=True)
        with self._lane_lock:
            for item in self._lane:
                item.done.cancel()
            self._lane.clear()

    def _split(self, batch: list[P], failed: Exception) -> tuple[BatchResult[SystemOneResponse], float]:
        """GPU thread: execute with splitting, starting from the failure of the staged attempt; returns the
        result and the engine time in seconds."""
        t0 = time.perf_counter()
        result = run_split(
            self._engine.execute,
            batch,
            single_attempts=self._single_attempts,
            out_of_memory=self._engine.out_of_memory,
            failed=failed,
        )
        return result, time.perf_counter() - t0


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 2)


def _respond(engine: ServingEngine[P, S, R], raw: R) -> tuple[list[SystemOneResponse], float]:
    """CPU pool: `engine.respond(raw)` and when it began (`perf_counter`)."""
    began = time.perf_counter()
    return engine.respond(raw), began
