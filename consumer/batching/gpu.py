"""The engine end of the batcher: runs one cut batch, with only GPU work on the one GPU thread.

The engine is an `engine.types.ServingEngine`: a batch is staged (collated, copied to the device) in the
prepare pool while the previous batch is still on the GPU, run on the GPU thread, and answered in the
prepare pool while the next batch runs. A batch whose staged run fails in any way goes through the
engine's `execute` with splitting on the GPU thread (`engine.batching.split.run_split`: the engine's one
splitting rule; its `out_of_memory` tells an OOM apart and frees the cache).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Generic, TypeVar

from consumer.logging import get_logger
from engine.batching.split import BatchResult, SplitStats, run_split
from engine.types import PreparedLike, ServingEngine
from schemas.response import SystemOneResponse

log = get_logger("consumer.batching.batcher")

P = TypeVar("P", bound=PreparedLike)
S = TypeVar("S")
R = TypeVar("R")
_In = TypeVar("_In")
_Out = TypeVar("_Out")

GpuDone = Callable[[float, bool], None]
"""Called once per batch when it left the GPU thread: (seconds it ran there, whether that is one clean run
the cost model may learn from)."""


class GpuRunner(Generic[P, S, R]):
    """Runs batches of `engine` on one GPU thread (its own) and the caller's CPU pool. Event loop only."""

    def __init__(
        self, engine: ServingEngine[P, S, R], cpu_pool: Executor, *, single_attempts: int = 2
    ) -> None:
        self._engine = engine
        self._cpu_pool = cpu_pool
        self._single_attempts = single_attempts
        self._gpu_pool = ThreadPoolExecutor(1, thread_name_prefix="clef-gpu")
        self.lead = 0.0  # seconds staging takes (exponential average)

    async def run(self, prepared: list[P], on_done: GpuDone) -> tuple[BatchResult[SystemOneResponse], float]:
        """Run `prepared` as one batch; returns its outcomes and its GPU seconds. `on_done` is called once,
        as soon as the batch left the GPU thread (before `respond`), or at the end if it never got there.
        Never raises for an engine error (a record failing alone is an `EngineError` outcome)."""
        loop = asyncio.get_running_loop()
        engine = self._engine
        done = False

        def release(seconds: float = 0.0, learn: bool = False) -> None:
            nonlocal done
            if not done:
                done = True
                on_done(seconds, learn)

        try:
            try:
                staged, stage_s = await loop.run_in_executor(self._cpu_pool, _timed, engine.stage, prepared)
                self.lead += 0.2 * (stage_s - self.lead)
                raw, elapsed = await loop.run_in_executor(self._gpu_pool, _timed, engine.run, staged)
                release(elapsed, True)
                responses = await loop.run_in_executor(self._cpu_pool, engine.respond, raw)
                if len(responses) != len(prepared):
                    raise RuntimeError(f"engine returned {len(responses)} results for {len(prepared)}")
                return BatchResult(list(responses), SplitStats(calls=1)), elapsed
            except Exception as exc:  # split from here on: the whole batch is not run again
                log.warning("staged_batch_failed", records=len(prepared), error=type(exc).__name__)
                failed = exc
            result, elapsed = await loop.run_in_executor(self._gpu_pool, self._split, prepared, failed)
            release(elapsed, False)  # a split run's time is not one batch's cost: keep it out of the model
            return result, elapsed
        finally:
            release()

    def shutdown(self) -> None:
        """Stop the GPU thread (a batch running finishes there; nothing new starts)."""
        self._gpu_pool.shutdown(wait=False, cancel_futures=True)

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


def _timed(fn: Callable[[_In], _Out], arg: _In) -> tuple[_Out, float]:
    t0 = time.perf_counter()
    out = fn(arg)
    return out, time.perf_counter() - t0
