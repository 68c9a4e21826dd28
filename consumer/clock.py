"""Time source for the pipeline, injectable so unit tests control flush deadlines.

`Clock.now()` is a monotonic reading in seconds; `Clock.sleep(seconds)` suspends the calling coroutine until
`now()` has advanced by at least `seconds`. `SystemClock` uses the event loop; `ManualClock` only moves when a
test calls `advance`, which also wakes every sleeper whose deadline has passed.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time plus a matching sleep."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """Real monotonic time (`time.monotonic`) and `asyncio.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class ManualClock:
    """A clock that moves only when `advance` is called (unit tests).

    Sleepers are woken in deadline order; `advance` yields to the loop once so woken coroutines run before
    the test continues.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut

    @property
    def sleepers(self) -> int:
        """Number of coroutines currently sleeping (not yet woken or cancelled)."""
        return sum(1 for _, _, fut in self._sleepers if not fut.done())

    async def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline is now due."""
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)
