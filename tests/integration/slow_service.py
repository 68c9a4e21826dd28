"""`clef-router run` with a slow stub engine, for rebalance tests that need work in flight for seconds.

Runs the run command's own serving code (`consumer.commands.service._serve`: signal handlers, pipeline,
shutdown) with settings from the environment (`CLEF_*`), and a `StubEngine` that sleeps
`SLOW_STUB_BATCH_S` seconds per batch in the GPU thread. Started by the tests as a subprocess:
`python tests/integration/slow_service.py` with the repository root on PYTHONPATH.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence

from consumer.commands.service import _serve
from consumer.logging import configure_logging, get_logger
from consumer.settings import load_settings
from devtools.stub import StubEngine, StubPrepared
from engine.batching.cut import BatchLimits
from schemas.response import SystemOneResponse


class SlowStub(StubEngine):
    """A stub engine that takes `batch_s` seconds per batch (a busy GPU)."""

    def __init__(self, batch_s: float, limits: BatchLimits) -> None:
        super().__init__(limits)
        self.batch_s = batch_s

    def execute(self, batch: Sequence[StubPrepared]) -> list[SystemOneResponse]:
        time.sleep(self.batch_s)
        return super().execute(batch)


def main() -> None:
    settings = load_settings()
    configure_logging(settings.log_level)
    for handler in logging.getLogger().handlers:  # stdlib (aiokafka) lines show their level, for the tests
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    get_logger("tests.slow_service").info("settings", settings=settings.masked())
    engine = SlowStub(float(os.environ.get("SLOW_STUB_BATCH_S", "0.5")), settings.batching.limits)
    asyncio.run(_serve(settings, engine))


if __name__ == "__main__":
    main()
