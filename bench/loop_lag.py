"""Event-loop lag of a bench process for a run's window: every late wake-up with its time.

`LoopLag` samples with the service's own sampler (`consumer.loop_lag.LoopLagSampler`) at a finer period
and keeps the samples, where the service only observes them into a histogram; it runs on the loop it
measures (the service's, in `bench.e2e --mixed`). `lag_figures` summarises the samples relative to the
window's start.
"""

from __future__ import annotations

from typing import Any

from consumer.loop_lag import LoopLagSampler

PERIOD_S = 0.005
MAX_SAMPLES = 200_000  # 1,000 s at the period: a bound on memory, never reached by a bench window


class LoopLag:
    """Samples (perf_counter due time, lateness s) while started; written by its sampler only."""

    def __init__(self, period: float = PERIOD_S) -> None:
        self.samples: list[tuple[float, float]] = []
        self._sampler = LoopLagSampler(self._keep, period, MAX_SAMPLES)

    def _keep(self, due: float, late: float) -> None:
        self.samples.append((due, late))

    def start(self) -> None:
        """Start sampling on the running loop (idempotent)."""
        self._sampler.start()

    async def stop(self) -> None:
        """Stop sampling (the samples stay)."""
        await self._sampler.stop()


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
