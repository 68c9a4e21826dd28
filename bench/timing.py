"""The benches' one way to time GPU work: three clocks, each for a different question.

- `synced_ms(fn)`: wall-clock milliseconds of one call between two device synchronisations: what a caller
  waits for, host work (Python, launches, copies) included.
- `event_ms(fn, warmup, reps)`: per-call milliseconds between CUDA events around eager calls, after
  `warmup` untimed calls: the device's time for the call's stream, launch gaps included.
- `graph_us(fn, reps, per_graph)`: median microseconds of one call inside a CUDA graph replay: the
  kernels alone, without the Python and launch time that events around eager calls would count.

Every function blocks until the timed work has finished on the device and needs CUDA (they raise what torch
raises without it). `fn` is called only for its effect; its result is dropped.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def synced_ms(fn: Callable[[], object]) -> float:
    """Milliseconds from a device synchronisation before `fn()` to one after it (one call, no warm-up)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000.0


def timing_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def event_ms(fn: Callable[[], object], warmup: int = 2, reps: int = 5) -> list[float]:
    """`reps` per-call milliseconds, each between two CUDA events on the current stream, after `warmup`
    untimed calls and a synchronisation."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start, end = timing_event(), timing_event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(float(start.elapsed_time(end)))
    return out


def graph_us(fn: Callable[[], object], reps: int = 20, per_graph: int = 5) -> float:
    """Median microseconds of one `fn` call: two warm-up calls on a side stream, then `per_graph` calls
    captured in one CUDA graph, replayed twice untimed and `reps` times between CUDA events."""
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn()
    for _ in range(2):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = timing_event(), timing_event()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)) * 1000.0 / per_graph)
    del graph
    return float(statistics.median(times))
