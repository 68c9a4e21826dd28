"""Where a slow batch of `bench.engine`'s stream comes from.

`python3 -m bench.stream_probe --out DIR` builds the full-size engine as `bench.engine` does (random bf16
weights, fast path, CUDA graphs; but Python's garbage collector left untuned), warms it the same way,
then streams the same 512-token requests at several budgets, some twice, and prints per stream:

- every batch's `Engine.run` time in order (`batch_ms`), so a slow batch shows where it falls;
- the Triton kernels compiled in this process during the stream (disk-cache hits included: Triton's
  `jit_cache_hook` fires on every in-memory cache miss), with the batch each one fell in;
- the CUDA caching allocator's counters over the stream (device mallocs and frees, retries after a
  failed malloc, and syncs of all streams), from `torch.cuda.memory_stats`;
- Python's garbage collections during the stream (count per generation, total ms, and each one over
  5 ms with its generation and batch); the last passes run after `gc.freeze()`.

Writes `stream_probe.jsonl` to `--out`. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from bench.engine import TimedRun, run_info, stream
from bench.report import emit_line as emit
from bench.workload import build_engine, make_request
from engine.batching.cut import BatchLimits
from engine.runner import EngineConfig

ALLOCATOR_COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")
PASSES = (4096, 4096, 65536, 65536, 131072, 65536, 65536, 131072)
"""Budgets streamed, in order: each first pass at a budget is followed by a second at the same budget
(65,536 a third time after 131,072), so first-time costs and recurring ones show apart; the last two
after `gc.freeze()` (`FREEZE_BEFORE`)."""
FREEZE_BEFORE = 6


@contextmanager
def collections() -> Iterator[list[tuple[float, int, float]]]:
    """Record (start time, generation, ms) of every garbage collection of Python's cyclic collector."""
    seen: list[tuple[float, int, float]] = []
    started: list[float] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            t = started.pop()
            seen.append((t, info["generation"], (time.perf_counter() - t) * 1000.0))

    gc.callbacks.append(callback)
    try:
        yield seen
    finally:
        gc.callbacks.remove(callback)


@contextmanager
def compiles() -> Iterator[list[tuple[float, str]]]:
    """Record (perf_counter time, kernel name) of every Triton compile in this process while open."""
    import triton

    seen: list[tuple[float, str]] = []

    def hook(**kwargs: Any) -> bool:
        seen.append((time.perf_counter(), str(kwargs["fn"].name)))
        return False  # go on compiling

    previous = triton.knobs.runtime.jit_cache_hook
    triton.knobs.runtime.jit_cache_hook = hook
    try:
        yield seen
    finally:
        triton.knobs.runtime.jit_cache_hook = previous


def allocator() -> dict[str, int]:
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in ALLOCATOR_COUNTERS}


def batch_of(t: float, spans: list[tuple[float, float]]) -> int:
    """Index of the run whose span holds `t`, -1 before the first (compiles on other threads count too)."""
    for i, (a, b) in enumerate(spans):
        if a <= t <= b:
            return i
    return -1 if not spans or t < spans[0][0] else len(spans)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []
    from engine.model.graphs import default_buckets

    config = EngineConfig(device="cuda", dtype="bfloat16", limits=BatchLimits(65536, 256), graph_buckets=())
    t0 = time.perf_counter()
    engine = build_engine(
        config, tune_process=False
    )  # the collector as Python leaves it, until FREEZE_BEFORE
    engine.model.enable_fast_path(graph_buckets=default_buckets(config.limits.max_tokens))
    emit(rows, **run_info(t0))
    rng = random.Random(0)
    reqs512 = [make_request(rng, engine, 512) for _ in range(1024)]
    stream(engine, reqs512[:64], 32768, 256)  # bench.engine's warm-up
    for i, budget in enumerate(PASSES):
        if i == FREEZE_BEFORE:
            gc.collect()
            gc.freeze()
            emit(rows, kind="gc_freeze", frozen=gc.get_freeze_count())
        timed = TimedRun(engine)
        before = allocator()
        with compiles() as seen, collections() as collected:
            r = stream(engine, reqs512, budget, 256, timed)
        after = allocator()
        emit(
            rows,
            kind="stream",
            pass_=i,
            budget=budget,
            tok_s=round(r["tok_s"]),
            steady_tok_s=round(r["steady_tok_s"]),
            batch_ms=[round((b - a) * 1000.0, 1) for a, b in timed.spans],
            compiles=[[name, batch_of(t, timed.spans)] for t, name in seen],
            allocator={k: after[k] - before[k] for k in ALLOCATOR_COUNTERS},
            gc_collections=[sum(1 for _, g, _ in collected if g == gen) for gen in range(3)],
            gc_ms_total=round(sum(ms for _, _, ms in collected), 1),
            gc_over_5ms=[[g, round(ms, 1), batch_of(t, timed.spans)] for t, g, ms in collected if ms > 5.0],
        )
    (out / "stream_probe.jsonl").write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
