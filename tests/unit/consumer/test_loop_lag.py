"""`consumer.loop_lag.LoopLagSampler`: a callback holding the loop is one late wake-up; the bound on
samples; stop ends the task; and the service's histogram it feeds."""

from __future__ import annotations

import asyncio
import time

import pytest

from consumer.loop_lag import LoopLagSampler
from consumer.metrics import Metrics


async def test_a_callback_holding_the_loop_is_one_late_wake_up() -> None:
    seen: list[tuple[float, float]] = []
    sampler = LoopLagSampler(lambda due, late: seen.append((due, late)), period_s=0.002)
    sampler.start()
    sampler.start()  # idempotent: one task
    await asyncio.sleep(0.02)
    asyncio.get_running_loop().call_soon(time.sleep, 0.06)  # holds the loop: one wake-up >= 50 ms late
    await asyncio.sleep(0.08)
    await sampler.stop()
    after = len(seen)
    await asyncio.sleep(0.01)
    assert len(seen) == after  # stopped: no more samples
    assert [late >= 0.05 for _, late in seen].count(True) == 1
    assert all(late >= 0.0 for _, late in seen)
    assert [due for due, _ in seen] == sorted(due for due, _ in seen)


async def test_max_samples_bounds_the_task_and_the_histogram_takes_them() -> None:
    metrics = Metrics()
    sampler = LoopLagSampler(lambda _, late: metrics.loop_lag.observe(late), 0.001, max_samples=5)
    sampler.start()
    for _ in range(200):  # bounded: 1 s
        if metrics.loop_lag.count == 5:
            break
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.01)
    assert metrics.loop_lag.count == 5
    assert b"clef_router_event_loop_lag_seconds_count 5.0" in metrics.render()
    await sampler.stop()


def test_a_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        LoopLagSampler(lambda _, __: None, 0.0)
