"""Event-loop lag of a bench process: how late a short sleep wakes up, sampled for a run's window.

A task sleeps `period` seconds again and again; each wake-up's lateness (the time past the due time) is one
sample. A loop busy with a long callback, or a loop thread waiting for the GIL while other threads hold it,
shows as late wake-ups. `LoopLag` runs on the loop it measures (the service's, in `bench.e2e --mixed`);
`figures` summarises the samples relative to the window's start.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

PERIOD_S = 0.005
MAX_SAMPLES = 200_000  # 1,000 s at the period: a bound on memory, never reached by a bench window


@dataclass(slots=True)
class LoopLag:
    """Samples (perf_counter due time, lateness s) while started; written by its own task only."""

    period: float = PERIOD_S
    samples: list[tuple[float, float]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start sampling on the running loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._sample(), name="bench-loop-lag")

    async def stop(self) -> None:
        """Stop sampling (the samples stay)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _sample(self) -> None:
        while len(self.samples) < MAX_SAMPLES:
            due = time.perf_counter() + self.period
            await asyncio.sleep(self.period)
            self.samples.append((due, max(0.0, time.perf_counter() - due)))


def lag_figures(samples: list[tuple[float, float]], t0: float, worst: int = 5) -> dict[str, Any]:
    """Samples' count, p50/p99/max lateness in ms, the seconds of lateness over 20 ms in total, and the
    `worst` latest wake-ups as (seconds after `t0`, ms), the latest first."""
    from bench.load_run import quantiles

    lags = [lag for _, lag in samples]
    q = quantiles(lags)
    top = sorted(samples, key=lambda s: s[1], reverse=True)[:worst]
    return {
        "samples": len(samples),
        "p50_ms": q["p50_ms"],
        "p99_ms": q["p99_ms"],
        "max_ms": q["max_ms"],
        "over_20ms_s": round(sum(lag for lag in lags if lag > 0.02), 3),
        "worst": [{"at_s": round(at - t0, 3), "ms": round(lag * 1e3, 2)} for at, lag in top],
    }
