"""Event-loop lag: how late a periodic sleep wakes up on the loop it runs on.

Everything of the service that is not GPU work shares one asyncio loop (fetching, producing, committing,
HTTP), and the loop thread shares the GIL with the prepare, GPU and urgent threads. A long callback on the
loop, or the loop thread waiting for the GIL while CPU-bound threads hold it, delays every one of those at
once; it shows here as a late wake-up (`clef_router_event_loop_lag_seconds`; `bench.e2e --mixed` prints the
worst ones). `LoopLagSampler` sleeps `period_s` again and again and hands each wake-up's lateness to
`observe`; it is started and stopped by whoever owns the loop's services (`clef-router run` and `serve`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from consumer.histogram import BulkHistogram

PERIOD_S = 0.05
"""The service's sampling period: 20 wake-ups a second, enough to see every stall of 50 ms or more."""

Observe = Callable[[float, float], None]
"""Called on the loop with (perf_counter time the wake-up was due, seconds it was late, >= 0)."""


class LoopLagSampler:
    """Samples the running loop's lag into `observe` while started (at most `max_samples` wake-ups when
    given, else until stopped). Event loop only."""

    def __init__(self, observe: Observe, period_s: float = PERIOD_S, max_samples: int | None = None) -> None:
        if period_s <= 0:
            raise ValueError("period_s must be positive")
        self._observe = observe
        self._period = period_s
        self._max = max_samples
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def into(cls, histogram: BulkHistogram) -> LoopLagSampler:
        """A sampler at the service's period observing each lateness into `histogram` (the service's
        `Metrics.loop_lag`)."""
        return cls(lambda _, late: histogram.observe(late))

    def start(self) -> None:
        """Start sampling on the running loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._sample(), name="clef-loop-lag")

    async def stop(self) -> None:
        """Stop sampling; returns once the sampling task has ended."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _sample(self) -> None:
        taken = 0
        while self._max is None or taken < self._max:
            due = time.perf_counter() + self._period
            await asyncio.sleep(self._period)
            self._observe(due, max(0.0, time.perf_counter() - due))
            taken += 1
