"""Bench-only probe (`BENCH_E2E_STAGE_PROBE=1 python3 -m bench.e2e ...`): where `Engine.stage` spends its
time inside a running service. Wraps `Engine.stage` and `ModelBatch.to` (the device copy at its end, timed
inside a stage only) in this process and records, per call, the wall time and the calling thread's CPU time
(`time.thread_time`).

A stage whose wall time is far above its CPU time waited: for the GIL (other threads' Python) or inside a
CUDA call. `to` apart from the rest tells the copy (one pinned buffer per dtype, torch calls that release
and retake the GIL) from the collate (numpy). `summary()` gives the means and quantiles; bench.e2e prints
it to stderr at exit as one JSON line starting with `stage_probe`. Never imported by the product.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_lock = threading.Lock()
_samples: dict[str, list[tuple[float, float]]] = {"stage": [], "to_device": []}


_inside = threading.local()  # .stage: this thread is inside a wrapped `Engine.stage`


def _timed(name: str, fn: Callable[P, T], *, outer: bool) -> Callable[P, T]:
    """`fn` timed under `name`: the outer call (stage) always, an inner one (the copy) only inside it."""

    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        if not outer and not getattr(_inside, "stage", False):
            return fn(*args, **kwargs)
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        if outer:
            _inside.stage = True
        try:
            return fn(*args, **kwargs)
        finally:
            if outer:
                _inside.stage = False
            sample = (time.perf_counter() - wall0, time.thread_time() - cpu0)
            with _lock:
                _samples[name].append(sample)

    return wrapper


def install() -> None:
    """Wrap `Engine.stage` and `ModelBatch.to` (process-wide, once)."""
    from engine.batching.collate import ModelBatch
    from engine.runner import Engine

    if getattr(Engine.stage, "__wrapped_by_probe__", False):
        return
    stage = _timed("stage", Engine.stage, outer=True)
    to = _timed("to_device", ModelBatch.to, outer=False)
    stage.__wrapped_by_probe__ = True  # type: ignore[attr-defined]
    Engine.stage = stage  # type: ignore[method-assign]
    ModelBatch.to = to  # type: ignore[method-assign]


def summary() -> dict[str, dict[str, float]]:
    """Per wrapped call: count, wall and CPU ms (mean, p50, p90, p99)."""
    out: dict[str, dict[str, float]] = {}
    with _lock:
        samples = {k: list(v) for k, v in _samples.items()}
    for name, rows in samples.items():
        if len(rows) < 2:
            continue
        walls = sorted(w * 1000 for w, _ in rows)
        cpus = sorted(c * 1000 for _, c in rows)
        q = statistics.quantiles(walls, n=100)
        qc = statistics.quantiles(cpus, n=100)
        out[name] = {
            "calls": len(rows),
            "wall_mean_ms": round(statistics.fmean(walls), 3),
            "wall_p50_ms": round(q[49], 3),
            "wall_p90_ms": round(q[89], 3),
            "wall_p99_ms": round(q[98], 3),
            "cpu_mean_ms": round(statistics.fmean(cpus), 3),
            "cpu_p50_ms": round(qc[49], 3),
            "cpu_p90_ms": round(qc[89], 3),
        }
    return out
