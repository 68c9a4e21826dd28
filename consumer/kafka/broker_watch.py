"""`BrokerWatch`: is the Kafka cluster reachable? Feeds `/readyz` and two gauges in `clef-router run`.

A consumer whose broker went away does not say so: aiokafka keeps its assignment and retries quietly (and
can hang after a broker restart, KAFKA.md). So a small admin client asks the cluster for its metadata every
`interval_s`, each probe bounded by `timeout_s`. `reachable()` is False once no probe has succeeded for
`unreachable_after_s`, and True again after the next successful probe: readiness recovers by itself.
Gauges: `clef_router_broker_reachable` (last probe) and `clef_router_broker_unreachable_seconds`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from aiokafka.admin import AIOKafkaAdminClient

from consumer.kafka.config import client_options
from consumer.kafka.settings import KafkaSettings
from consumer.logging import get_logger
from consumer.metrics import Metrics

log = get_logger("consumer.kafka.broker_watch")


class BrokerWatch:
    """See the module docstring. Event loop only: `start()`, `reachable()`, `stop()`."""

    def __init__(
        self,
        settings: KafkaSettings,
        metrics: Metrics,
        unreachable_after_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._bound = unreachable_after_s
        self.interval_s = max(0.25, min(5.0, unreachable_after_s / 4))
        self.timeout_s = max(0.5, min(10.0, unreachable_after_s / 2))
        self._clock = clock
        self._last_ok = clock()  # the service reached the broker at start (it cannot start otherwise)
        self._up = True
        self._admin: AIOKafkaAdminClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._probing = asyncio.Lock()

    def reachable(self) -> bool:
        """False while no probe has succeeded for `unreachable_after_s` seconds."""
        return self._clock() - self._last_ok <= self._bound

    def unreachable_seconds(self) -> float:
        """Seconds since the last successful probe (0 while the last probe succeeded)."""
        return 0.0 if self._up else self._clock() - self._last_ok

    async def start(self) -> None:
        """Start probing in the background (non-blocking)."""
        self._task = asyncio.create_task(self._loop(), name="clef-broker-watch")

    async def stop(self) -> None:
        """Stop probing and close the admin client."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._drop_admin()

    async def probe_once(self) -> bool:
        """One metadata round trip within `timeout_s`; records the outcome and returns it. Probes never
        overlap (a second caller waits for the first)."""
        async with self._probing:
            try:
                if self._admin is None:
                    admin = AIOKafkaAdminClient(
                        **client_options(self._settings), request_timeout_ms=int(self.timeout_s * 1000)
                    )
                    try:
                        await asyncio.wait_for(admin.start(), self.timeout_s)
                    except BaseException:
                        with contextlib.suppress(Exception):
                            await asyncio.wait_for(admin.close(), self.timeout_s)
                        raise
                    self._admin = admin
                await asyncio.wait_for(self._admin.describe_cluster(), self.timeout_s)
            except Exception as exc:  # any failure to get an answer is "not reachable now"
                await self._drop_admin()  # next probe bootstraps afresh (the broker may have moved)
                self._record(False, type(exc).__name__)
                return False
            self._record(True, "")
            return True

    def _record(self, ok: bool, error: str) -> None:
        if ok:
            if not self._up:
                log.info("broker_reachable_again", down_s=round(self._clock() - self._last_ok, 1))
            self._last_ok = self._clock()
        elif self._up:
            log.warning("broker_unreachable", error=error, bound_s=self._bound)
        self._up = ok
        self._metrics.broker_reachable.set(1 if ok else 0)
        self._metrics.broker_unreachable_seconds.set(self.unreachable_seconds())

    async def _loop(self) -> None:
        while True:
            await self.probe_once()
            await asyncio.sleep(self.interval_s)

    async def _drop_admin(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(admin.close(), self.timeout_s)
