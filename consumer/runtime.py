"""Process-wide runtime tuning applied once when the service starts, and bounded steps for shutdown.

The cyclic garbage collector runs a generation-0 pass every 700 net container allocations by default. The
service allocates a few dozen containers per record (decoded JSON, request and response models, output
records) and keeps thousands of records in flight, so at tens of thousands of records per second the
default makes collections a tenth of the CPU time, mostly re-scanning live in-flight records. `tune_gc`
raises the generation-0 threshold and freezes what start-up left alive (modules, engine, settings), so
collections scan only new objects. Garbage cycles are still collected, just in larger, rarer passes.

`set_switch_interval` sets how long a thread running Python keeps the GIL while another thread waits for it
(`sys.setswitchinterval`). The GPU thread gives the GIL up around every torch call it makes (a batch launches
a few hundred kernels, the joint head's eagerly) and must take it back each time; beside a thread that runs
Python (preparing records, staging or answering a batch, the event loop) each take-back can wait out a whole
interval, while the GPU idles if its queue has run dry (`bench.gil_convoy`, `bench.batcher_model
--switch-interval-ms`; BENCHMARKS.md).

`tune_process` applies both from the settings; every entry point (the pipeline, the HTTP server) calls it
once at start.

`bounded` runs one shutdown step (leaving the group, closing a client) within the time left, so a stop
returns within its bound even when a step waits on the broker (e.g. a rebalance in progress).
"""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from consumer.logging import get_logger

if TYPE_CHECKING:
    from consumer.settings import Settings

log = get_logger("consumer.runtime")


def tune_process(settings: Settings) -> None:
    """The service's start-up tuning from its settings, in one place for every entry point (the Kafka
    pipeline, the HTTP server): `tune_gc` (`gc_gen0_threshold`, `gc_freeze`), then `set_switch_interval`
    (`gil_switch_interval_ms`). Blocking (one full collection); call it once, before records flow."""
    tune_gc(settings.gc_gen0_threshold, freeze=settings.gc_freeze)
    set_switch_interval(settings.gil_switch_interval_ms)


def tune_gc(gen0_threshold: int, *, freeze: bool) -> None:
    """Set the generation-0 threshold (0 leaves Python's) and, with `freeze`, collect once and move every
    object alive now to the permanent generation (`gc.freeze`). Blocking (one full collection); call it
    once at start-up, before records flow. Process-wide."""
    if freeze:
        gc.collect()
        gc.freeze()
    if gen0_threshold > 0:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(gen0_threshold, gen1, gen2)
    log.info("gc_tuned", gen0_threshold=gc.get_threshold()[0], frozen=gc.get_freeze_count())


def set_switch_interval(ms: float) -> None:
    """Set the GIL switch interval to `ms` milliseconds (`sys.setswitchinterval`; Python's default is 5).
    Process-wide; call it once at start-up. Raises ValueError for a value that is not positive."""
    if not ms > 0:
        raise ValueError(f"the switch interval must be positive, got {ms} ms")
    sys.setswitchinterval(ms / 1000.0)
    log.info("gil_switch_interval", ms=round(sys.getswitchinterval() * 1000.0, 3))


async def bounded(step: Awaitable[None], timeout_s: float, what: str) -> bool:
    """Await `step` for at most `timeout_s` seconds; True when it finished. On timeout it is cancelled and
    a warning names `what` (the caller goes on: shutting down, a late step must not hold the exit). Errors
    of the step are logged as warnings, not raised."""
    try:
        await asyncio.wait_for(step, max(timeout_s, 0.001))
    except TimeoutError:
        log.warning("shutdown_step_timed_out", step=what, seconds=round(timeout_s, 3))
        return False
    except Exception as exc:
        log.warning("shutdown_step_failed", step=what, error=repr(exc)[:300])
        return False
    return True
