"""`bench.loop_lag`: a callback that holds the loop shows as one late wake-up; the figures of samples."""

from __future__ import annotations

import asyncio
import time

from bench.loop_lag import LoopLag, lag_figures


def test_a_blocking_callback_is_a_late_wake_up() -> None:
    async def run() -> LoopLag:
        lag = LoopLag(period=0.002)
        lag.start()
        await asyncio.sleep(0.02)
        asyncio.get_running_loop().call_soon(time.sleep, 0.06)  # holds the loop: one wake-up >= 50 ms late
        await asyncio.sleep(0.08)
        await lag.stop()
        return lag

    lag = asyncio.run(run())
    assert len(lag.samples) >= 3
    late = [s for s in lag.samples if s[1] >= 0.05]
    assert len(late) == 1
    assert lag_figures(lag.samples, lag.samples[0][0])["max_ms"] >= 50.0


def test_lag_figures_worst_first_from_the_window_start() -> None:
    samples = [(10.0, 0.001), (10.5, 0.025), (11.0, 0.004), (12.0, 0.1)]
    figures = lag_figures(samples, 10.5, worst=2)
    assert figures["samples"] == 4
    assert figures["max_ms"] == 100.0
    assert figures["over_20ms_s"] == 0.125
    assert figures["worst"] == [{"at_s": 1.5, "ms": 100.0}, {"at_s": 0.0, "ms": 25.0}]
    assert lag_figures([], 0.0)["worst"] == []
