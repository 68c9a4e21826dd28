"""Bench-only probe (`BENCH_E2E_STAGE_PROBE=1 python3 -m bench.e2e ...`): where `Engine.stage` and
`Engine.run` spend their time inside a running service. Wraps, in this process, `Engine.stage` with the
device copy at its end (`ModelBatch.to`, timed inside a stage only), and `Engine.run` with the wait for the
GPU at its end (`engine.model.clef.HostCopy.wait`, timed inside a run only), and records per call the wall
time and the calling thread's CPU time (`time.thread_time`). It times blocking runs: with
`batching.launch_ahead` the service launches bulk batches (`Engine.launch`) and waits for them on another
thread, and only the lane's runs go through `Engine.run`.

A call whose wall time is far above its CPU time waited: for the GIL (other threads' Python) or inside a
CUDA call. `to_device` apart from the rest of a stage tells the copy from the collate (numpy). A run is the
host launching the batch's kernels (graph replays, the head's eager kernels), then `to_host` waiting for
the GPU to finish them: `launch` is each run less its `to_host` calls. A launch that grows in wall time
while its CPU time does not waited for the GIL, and the GPU may have idled meanwhile; a `to_host` that
grows is GPU time. `install` also times every pass of the cyclic garbage collector (`gc.callbacks`): a
pass holds the GIL from start to end, whatever thread triggered it, so it stalls the launches and the staging
alike. `summary()` gives the means and quantiles, the collector's passes per generation, and how the runs
that met a pass of at least 1 ms compare with the rest; bench.e2e prints it to stderr at exit as one JSON line
starting with `stage_probe`. Never imported by the product.

The GIL sampler (`install(gil_period_s=...)`, bench.e2e's `BENCH_E2E_GIL_PROBE_MS`): a thread of its own
sleeps `period` again and again and records how late each wake-up ran Python (`lag`). A wake-up needs the
GIL; a thread running Python hands it over within a switch interval, so a lag much above the interval (or
above the OS's wake-up jitter, well under a millisecond on an idle core) means something held the GIL
without a break: a collector pass, a long C call that keeps it (a validator, `sum` of a big range), or the
process descheduled. A slow run that meets no such lag stalled elsewhere: in the CUDA driver or on the GPU.
The sampler takes the GIL for a few microseconds a wake-up (`GIL_PERIOD_S` apart by default).
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_lock = threading.Lock()
_samples: dict[str, list[tuple[float, float]]] = {
    "stage": [],
    "to_device": [],
    "run": [],
    "to_host": [],
    "launch": [],
}
_runs: list[tuple[float, float]] = []  # each timed run's (start, end), perf_counter seconds
_gc: list[tuple[float, float, int]] = []  # each collector pass's (start, end, generation)
_gc_started = threading.local()  # .at: perf_counter when this thread's pass began
_lags: list[tuple[float, float]] = []  # each late wake-up's (when it was due, lag seconds), from `GIL_MET_S`
_wakes = [0]  # wake-ups of the sampler since the last reset
GIL_PERIOD_S = 0.002
"""The sampler's sleep between wake-ups."""
GIL_MET_S = 0.001
"""Wake-ups at least this late are kept (and a run "met" a GIL stall when one of at least `GIL_STALL_S`
overlapped it)."""
GIL_STALL_S = 0.005
"""A lag this long is a stall: the switch interval (5 ms by default) or more."""
GIL_LONG_S = 0.01
"""Lags at least this long are also listed one by one (`gil_long`)."""
GC_MET_S = 0.001
"""A run "met" the collector when a pass of at least this long overlapped it."""
GC_LONG_S = 0.01
"""Passes at least this long are also listed one by one (`gc_long`)."""
OUTER_OF = {"to_device": "stage", "to_host": "run"}
"""Each inner call and the outer call it is timed inside (only there)."""
_inside = threading.local()  # .<outer>: [inner wall, inner CPU] while this thread is inside that outer call


def _timed(name: str, fn: Callable[P, T]) -> Callable[P, T]:
    """`fn` timed under `name`: an outer call (stage, run) always, an inner one only inside its outer one.
    An outer call with inner ones also adds a sample of itself less them (run: `launch`)."""
    outer = OUTER_OF.get(name)

    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        inner: list[float] | None = None
        if outer is not None:
            inner = getattr(_inside, outer, None)
            if inner is None:
                return fn(*args, **kwargs)
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        if outer is None:
            setattr(_inside, name, [0.0, 0.0])
        try:
            return fn(*args, **kwargs)
        finally:
            ended = time.perf_counter()
            sample = (ended - wall0, time.thread_time() - cpu0)
            rest: tuple[float, float] | None = None
            if inner is not None:
                inner[0] += sample[0]
                inner[1] += sample[1]
            else:
                spent = getattr(_inside, name)
                setattr(_inside, name, None)
                if name == "run":
                    rest = (sample[0] - spent[0], sample[1] - spent[1])
            with _lock:
                _samples[name].append(sample)
                if rest is not None:
                    _samples["launch"].append(rest)
                    _runs.append((wall0, ended))

    return wrapper


def install(gil_period_s: float | None = None) -> None:
    """Wrap `Engine.stage`, `ModelBatch.to`, `Engine.run` and `engine.model.clef.HostCopy.wait` (process-wide,
    once); with `gil_period_s`, also start the GIL sampler at that period (a daemon thread)."""
    from engine.batching.collate import ModelBatch
    from engine.model import clef
    from engine.runner import Engine

    if getattr(Engine.stage, "__wrapped_by_probe__", False):
        return
    stage = _timed("stage", Engine.stage)
    stage.__wrapped_by_probe__ = True  # type: ignore[attr-defined]
    Engine.stage = stage  # type: ignore[method-assign]
    gc.callbacks.append(_on_gc)
    ModelBatch.to = _timed("to_device", ModelBatch.to)  # type: ignore[method-assign]
    Engine.run = _timed("run", Engine.run)  # type: ignore[method-assign]
    clef.HostCopy.wait = _timed("to_host", clef.HostCopy.wait)  # type: ignore[method-assign]
    if gil_period_s is not None:
        start_gil_sampler(gil_period_s)


def start_gil_sampler(
    period_s: float = GIL_PERIOD_S, *, stop: threading.Event | None = None
) -> threading.Thread:
    """Start the GIL sampler (see the module docstring) on a daemon thread; it runs until `stop` is set
    (never, without one). Returns the thread."""
    if not period_s > 0:
        raise ValueError(f"the sampler's period must be positive, got {period_s}")
    ended = stop or threading.Event()

    def sample() -> None:
        while not ended.is_set():
            due = time.perf_counter() + period_s
            time.sleep(period_s)
            lag = time.perf_counter() - due
            _wakes[0] += 1
            if lag >= GIL_MET_S:
                _lags.append((due, lag))  # atomic under the GIL; bounded by the run's length / GIL_MET_S

    thread = threading.Thread(target=sample, name="clef-gil-sampler", daemon=True)
    thread.start()
    return thread


def reset() -> None:
    """Forget every sample so far (bench.e2e: before the Kafka phase, so the engine-only capacity run's
    batches and the full collections of start-up do not count)."""
    with _lock:
        for rows in _samples.values():
            rows.clear()
        _runs.clear()
        _gc.clear()
        _lags.clear()
        _wakes[0] = 0


def _on_gc(phase: str, info: dict[str, int]) -> None:
    """`gc.callbacks` hook: record each pass's start, end and generation. Takes no lock (a pass may start
    inside `_lock`, in the thread holding it); a list's append is atomic under the GIL."""
    if phase == "start":
        _gc_started.at = time.perf_counter()
        return
    began = getattr(_gc_started, "at", None)
    if began is not None:
        _gc.append((began, time.perf_counter(), int(info["generation"])))


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "calls": len(ordered),
        "ms_mean": round(statistics.fmean(ordered), 3),
        "ms_p50": round(ordered[len(ordered) // 2], 3),
        "ms_max": round(ordered[-1], 3),
        "ms_total": round(sum(ordered), 3),
    }


def _runs_split(
    runs: list[tuple[float, float]], windows: list[tuple[float, float]], what: str
) -> dict[str, dict[str, float]]:
    """The runs' wall ms (calls and ms mean / p50 / max) split by whether one of `windows` (start, end)
    overlapped them: `runs_met_<what>` and `runs_no_<what>`, each only when it has runs."""
    met: list[float] = []
    clear: list[float] = []
    for start, end in runs:
        hit = any(s < end and e > start for s, e in windows)
        (met if hit else clear).append((end - start) * 1000)
    out: dict[str, dict[str, float]] = {}
    for name, walls in ((f"runs_met_{what}", met), (f"runs_no_{what}", clear)):
        if walls:
            row = _ms(walls)
            del row["ms_total"]
            out[name] = row
    return out


def gc_summary(
    runs: list[tuple[float, float]], passes: list[tuple[float, float, int]]
) -> dict[str, dict[str, float]]:
    """The collector's passes per generation (`gc_gen<N>`: calls, ms mean / p50 / max / total) and the runs'
    wall ms split by whether a pass of at least `GC_MET_S` overlapped them (`runs_met_gc`, `runs_no_gc`:
    calls and ms mean / p50 / max); `gc_long` lists the passes of at least `GC_LONG_S` (at most 40) as
    `s<seconds after the first run began, negative before it>_gen<N>`: ms."""
    out: dict[str, dict[str, float]] = {}
    for generation in sorted({g for _, _, g in passes}):
        out[f"gc_gen{generation}"] = _ms([(e - s) * 1000 for s, e, g in passes if g == generation])
    out.update(_runs_split(runs, [(s, e) for s, e, _ in passes if e - s >= GC_MET_S], "gc"))
    first = min((start for start, _ in runs), default=0.0)
    listed = [(s, e, g) for s, e, g in passes if e - s >= GC_LONG_S][:40]
    if listed:
        out["gc_long"] = {f"s{s - first:.3f}_gen{g}": round((e - s) * 1000, 3) for s, e, g in listed}
    return out


def gil_summary(
    runs: list[tuple[float, float]], lags: list[tuple[float, float]], wakes: int
) -> dict[str, dict[str, float]]:
    """The sampler's lags (`gil_lag`: wake-ups, how many were at least `GIL_MET_S`, `GIL_STALL_S` and
    `GIL_LONG_S` late, the largest lag and the stalls' total ms), the runs' wall ms split by whether a
    stall overlapped them (`runs_met_gil`, `runs_no_gil`: calls and ms mean / p50 / max), and the lags of
    at least `GIL_LONG_S` (at most 40) as `s<seconds after the first run began>`: ms (`gil_long`). A lag
    covers from when its wake-up was due until it ran. Empty when the sampler never woke."""
    if wakes == 0:
        return {}
    stalls = [(due, due + lag) for due, lag in lags if lag >= GIL_STALL_S]
    out: dict[str, dict[str, float]] = {
        "gil_lag": {
            "wakes": wakes,
            "late_1ms": len(lags),
            "late_5ms": len(stalls),
            "late_10ms": sum(1 for _, lag in lags if lag >= GIL_LONG_S),
            "ms_max": round(max((lag for _, lag in lags), default=0.0) * 1000, 3),
            "stall_ms_total": round(sum(e - s for s, e in stalls) * 1000, 3),
        }
    }
    out.update(_runs_split(runs, stalls, "gil"))
    first = min((start for start, _ in runs), default=0.0)
    listed = [(due, lag) for due, lag in lags if lag >= GIL_LONG_S][:40]
    if listed:
        out["gil_long"] = {f"s{due - first:.3f}": round(lag * 1000, 3) for due, lag in listed}
    return out


def summary() -> dict[str, dict[str, float]]:
    """Per wrapped call (and `launch`): count, wall and CPU ms (mean, p50, p90, p99); then `gc_summary`
    and `gil_summary`."""
    out: dict[str, dict[str, float]] = {}
    with _lock:
        samples = {k: list(v) for k, v in _samples.items()}
        runs, passes, lags, wakes = list(_runs), list(_gc), list(_lags), _wakes[0]
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
    out.update(gc_summary(runs, passes))
    out.update(gil_summary(runs, lags, wakes))
    return out
