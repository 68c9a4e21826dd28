"""Process-wide runtime tuning applied once when the service starts.

The cyclic garbage collector runs a generation-0 pass every 700 net container allocations by default. The
service allocates a few dozen containers per record (decoded JSON, request and response models, output
records) and keeps thousands of records in flight, so at tens of thousands of records per second the
default makes collections a tenth of the CPU time, mostly re-scanning live in-flight records. `tune_gc`
raises the generation-0 threshold and freezes what start-up left alive (modules, engine, settings), so
collections scan only new objects. Garbage cycles are still collected, just in larger, rarer passes.
"""

from __future__ import annotations

import gc

from consumer.logging import get_logger

log = get_logger("consumer.runtime")


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
