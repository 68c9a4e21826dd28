"""Where one 800-token request's wall time goes on the H200: `Engine.decide` split into its stages
(`--records N`: a batch of N such requests, the size of a batch at moderate load).

`python3 -m bench.one_request --out DIR` builds the full-size engine as `bench.experts` does (random bf16
weights, fast path, CUDA graphs up to `--graph-tokens` tokens (default 8,192, as the service; until round
twenty-one 4,096, so a 6-record batch of 4,816 tokens ran eagerly), routers levelled to near-uniform
expert load unless `--random-router`) and times, for one 800-token request, 30 times each (after warm-up),
with CUDA synchronisation:

- `decide`: the whole call, as `bench.engine.latency` measures it;
- `prepare` (validation and encoding, CPU), `stage` (collate and the copy to the GPU), `run` (graph
  replay, head, copy back) and `respond` (answers, CPU);
- inside `run`: the decoder alone (`hidden_states`) and the head alone on its output.

Then the GPU's timeline of `--reps` `decide` calls (torch profiler, CUDA activity, idle between calls):
per call the span from its first to its last kernel or copy, the busy time inside it, the idle gaps
between them (launch and dependency latency inside the graph, host time the GPU waits for) and the
count of kernels; the largest gaps summed over the calls, by the pair of kernels around them; and the GPU
time per call of the kernels that take the most, by name (`kernel` rows).

Prints JSON lines (p50/p99/min per stage, the timeline) and writes `one_request.jsonl` to `--out`, and
Python's profile of `--reps` `decide` calls (cumulative time) to `profile_decide.txt`; with several
`--records` counts, the rows of each in turn, and the profile (and `--trace`'s trace) of the last. First, the
routers' spread over the levelling batch: `routes.json` (per layer, how many tokens picked each expert; what
`bench.moe_fp8 --routes` draws from) and a `routes` row. Not a test.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.engine import timings
from bench.report import emit_line as emit


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--reps", type=int, default=30)
    p.add_argument(
        "--trace", action="store_true", help="also write decide_trace.json (two calls, chrome trace)"
    )
    p.add_argument(
        "--random-router",
        action="store_true",
        help="leave the routers as built (no levelling): the issue's setup",
    )
    p.add_argument(
        "--fp8",
        choices=("off", "experts", "attention", "text"),
        default="off",
        help="run the experts (and with `attention` the attention projections too) in FP8 (default bf16);"
        " `text`: experts and attention in FP8 with the bf16 experts freed (fits an 80 GB card)",
    )
    p.add_argument(
        "--tiles-from",
        type=Path,
        default=None,
        help="with --fp8: measure again with the FP8 shapes of bench.moe_fp8's tiles_best.json (a `tiles`"
        " line first; graphs recaptured; the shipped shapes back after), same process",
    )
    p.add_argument(
        "--records", default="1", help="requests decided together, comma-separated counts (default one)"
    )
    p.add_argument("--tokens", type=int, default=800, help="tokens of each request")
    p.add_argument(
        "--graph-tokens",
        type=int,
        default=8192,
        help="largest CUDA graph bucket (default 8,192, the service's; 4,096 before round twenty-one)",
    )
    p.add_argument(
        "--sm90",
        action="store_true",
        help="with --fp8: measure again with the FP8 experts of the calls moe_fp8_sm90.takes accepts through"
        " the CUDA cluster kernels (engine.kernels.moe_fp8_sm90; nvcc and ninja needed), same process",
    )
    p.add_argument(
        "--sm90-from-rows",
        type=int,
        default=None,
        help="with --sm90: the average rows an expert from which a call takes the CUDA kernels"
        " (moe_fp8_sm90.FROM_ROWS_PER_EXPERT; default the shipped one)",
    )
    p.add_argument(
        "--sm90-down-from-rows",
        default="",
        help="with --sm90: measure again at each of these average rows an expert (comma-separated) from which"
        " a call's down GEMM alone takes the CUDA kernel (moe_fp8_sm90.DOWN_FROM_ROWS_PER_EXPERT; graphs"
        " recaptured; an `sm90` line before each), same process",
    )
    p.add_argument(
        "--fp8-large-from-rows",
        default="",
        help="with --fp8: measure again at each of these average rows an expert (comma-separated) from which"
        " both Triton FP8 GEMMs take their large tiles (moe_fp8.LARGE_FROM_ROWS_PER_EXPERT and"
        " DOWN_LARGE_FROM_ROWS_PER_EXPERT; 192: the regimes before their split; graphs recaptured; a `regime`"
        " line before each), same process",
    )
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []

    from bench.e2e_run import FP8_MODES
    from bench.experts import biased_engine
    from bench.routing import level
    from bench.workload import make_request
    from engine.kernels import moe_fp8

    engine, biases, buckets = biased_engine(args.graph_tokens)
    rng = random.Random(0)
    probe = engine.model.collate([engine.prepare(make_request(rng, engine, 512)).encoded for _ in range(16)])
    if not args.random_router:
        with torch.inference_mode():
            level(engine, biases, probe)
    write_routes(rows, out, engine, probe, levelled=not args.random_router)
    if args.tiles_from is not None and not args.tiles_from.is_file():
        raise SystemExit(f"one_request: no tiles file {args.tiles_from}")
    counts = [int(n) for n in args.records.split(",")]

    def recapture(sm90: Any = None) -> None:  # the graphs again, with the module settings now in force
        engine.model.enable_fast_path(graph_buckets=buckets, sm90_experts=sm90, **FP8_MODES[args.fp8])

    def remeasure(sm90: Any = None) -> list[Any]:  # every --records batch again; the last one's requests
        recapture(sm90)
        return [measure(rows, engine, n, args, None, sm90=sm90 is not None) for n in counts][-1]

    if args.fp8 != "off":  # after levelling: the FP8 copies are made from the same weights, graphs recaptured
        recapture()
    reqs = [measure(rows, engine, n, args, out if args.trace else None) for n in counts][-1]
    if args.tiles_from is not None and args.fp8 != "off":  # the file's shapes, then the shipped ones back
        from bench.fp8_modes import use_tiles

        kept = moe_fp8.SMALL, moe_fp8.LARGE
        emit(rows, kind="tiles", fp8=use_tiles(args.tiles_from))
        reqs = remeasure()
        moe_fp8.SMALL, moe_fp8.LARGE = kept
        recapture()
    shipped = moe_fp8.LARGE_FROM_ROWS_PER_EXPERT, moe_fp8.DOWN_LARGE_FROM_ROWS_PER_EXPERT
    thresholds = [int(n) for n in args.fp8_large_from_rows.split(",") if n] if args.fp8 != "off" else []
    for from_rows in thresholds:  # read per call; the graphs are recaptured with them
        moe_fp8.LARGE_FROM_ROWS_PER_EXPERT = moe_fp8.DOWN_LARGE_FROM_ROWS_PER_EXPERT = from_rows
        emit(rows, kind="regime", large_from_rows_per_expert=from_rows, shipped=list(shipped))
        reqs = remeasure()
    if thresholds:  # the shipped regimes (and their graphs) again, for --sm90 and the profile
        moe_fp8.LARGE_FROM_ROWS_PER_EXPERT, moe_fp8.DOWN_LARGE_FROM_ROWS_PER_EXPERT = shipped
        recapture()
    if args.sm90 and args.fp8 != "off":
        from engine.kernels import moe_fp8_sm90

        ext = moe_fp8_sm90.build(moe_fp8_sm90.BUILD_DIR)
        if args.sm90_from_rows is not None:
            moe_fp8_sm90.FROM_ROWS_PER_EXPERT = args.sm90_from_rows
        downs = [int(n) for n in args.sm90_down_from_rows.split(",") if n]
        for down in downs or [moe_fp8_sm90.DOWN_FROM_ROWS_PER_EXPERT]:  # read per call
            moe_fp8_sm90.DOWN_FROM_ROWS_PER_EXPERT = down
            emit(
                rows,
                kind="sm90",
                from_rows_per_expert=moe_fp8_sm90.FROM_ROWS_PER_EXPERT,
                down_from_rows_per_expert=down,
            )
            reqs = remeasure(ext)  # graphs recaptured with the CUDA kernels in
    (out / "one_request.jsonl").write_text("\n".join(rows) + "\n")
    # Where `decide`'s host time goes beyond its stages: Python's profiler over `reps` calls (the last batch).
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [engine.decide(reqs) for _ in range(args.reps)])
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(45)
    (out / "profile_decide.txt").write_text(text.getvalue())
    return 0


def write_routes(rows: list[str], out: Path, engine: Any, batch: Any, *, levelled: bool) -> None:
    """`routes.json` (`bench.routing.load_profiles` over `batch`: what `bench.moe_fp8 --routes` draws from)
    and a `routes` row: the busiest expert's load over the mean, per layer's median and worst."""
    from bench.routing import load_profiles

    profiles = load_profiles(engine, batch)
    doc = {"levelled": levelled, "pairs": sum(profiles[0]), "layers": profiles}
    (out / "routes.json").write_text(json.dumps(doc) + "\n")
    spread = sorted(max(c) * len(c) / max(sum(c), 1) for c in profiles)
    emit(
        rows,
        kind="routes",
        levelled=levelled,
        layers=len(profiles),
        busiest_over_mean_median=round(spread[len(spread) // 2], 2),
        busiest_over_mean_max=round(spread[-1], 2),
    )


def measure(
    rows: list[str],
    engine: Any,
    records: int,
    args: argparse.Namespace,
    trace: Path | None,
    *,
    sm90: bool = False,
) -> list[Any]:
    """The `request`, `stage`, `timeline`, `gap` and `kernel` rows of one batch of `records` requests of
    `args.tokens` tokens (`sm90`: the FP8 experts through `engine.kernels.moe_fp8_sm90`, marked on the
    `request` row); returns the requests."""
    from bench.workload import make_request

    req_rng = random.Random(1)
    reqs = [make_request(req_rng, engine, args.tokens) for _ in range(records)]
    prepared = [engine.prepare(r) for r in reqs]
    staged = engine.stage(prepared)
    result = engine.run(staged)
    model: Any = engine.model
    batch = model.collate([p.encoded for p in prepared])
    emit(
        rows,
        kind="request",
        records=len(prepared),
        tokens=sum(p.num_tokens for p in prepared),
        fp8=args.fp8,
        levelled=not args.random_router,
        sm90=sm90,
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    )
    box: dict[str, torch.Tensor] = {}

    def decoder() -> None:
        with torch.inference_mode():
            box["h"] = model.hidden_states(batch)

    def head() -> None:
        with torch.inference_mode():
            model.head(box["h"], model.lexical_table(), batch.index).float().cpu()

    stages: dict[str, Callable[[], object]] = {
        "decide": lambda: engine.decide(reqs),
        "prepare": lambda: [engine.prepare(r) for r in reqs],
        "stage": lambda: engine.stage(prepared),
        "run": lambda: engine.run(staged),
        "respond": lambda: engine.respond(result),
        "decoder": decoder,
        "head": head,
    }
    for name, fn in stages.items():
        emit(rows, kind="stage", stage=name, **{k: round(v, 2) for k, v in timings(fn, args.reps).items()})
    timeline(rows, lambda: engine.decide(reqs), args.reps, trace)
    return reqs


CALL_SEPARATOR_S = 0.005
"""GPU idle left between two profiled calls, so a gap longer than 4 ms marks where one call ends."""


def timeline(rows: list[str], call: Callable[[], object], reps: int, trace_dir: Path | None) -> None:
    """Emit the `timeline` row (per-call medians), the twelve largest `gap` rows and the fifteen largest
    `kernel` rows (see module doc); with `trace_dir`, also the chrome trace of two more calls there
    (`decide_trace.json`)."""
    from torch.profiler import ProfilerActivity, profile

    if trace_dir is not None:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=False) as traced:
            for _ in range(2):
                call()
                torch.cuda.synchronize()
        traced.export_chrome_trace(str(trace_dir / "decide_trace.json"))

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
            torch.cuda.synchronize()
            time.sleep(CALL_SEPARATOR_S)
    events = sorted(
        (float(e.time_range.start), float(e.time_range.end), str(e.name))
        for e in prof.events()
        if e.device_type.name == "CUDA"
    )
    spans, busy, kernels, gaps = per_call(events)
    emit(
        rows,
        kind="timeline",
        calls=len(spans),
        span_ms_p50=round(statistics.median(spans), 2),
        busy_ms_p50=round(statistics.median(busy), 2),
        idle_ms_p50=round(statistics.median(s - b for s, b in zip(spans, busy, strict=True)), 2),
        kernels_and_copies_p50=statistics.median(kernels),
    )
    for (before, after), us in sorted(gaps.items(), key=lambda kv: -kv[1])[:12]:
        emit(rows, kind="gap", before=before, after=after, us_per_call=round(us / len(spans), 1))
    for name, (us, n) in sorted(by_kernel(events).items(), key=lambda kv: -kv[1][0])[:15]:
        emit(rows, kind="kernel", name=name, us_per_call=round(us / len(spans), 1), per_call=n / len(spans))


def by_kernel(events: list[tuple[float, float, str]]) -> dict[str, tuple[float, int]]:
    """GPU events (start us, end us, name) summed by name (its first 60 characters): (us, count)."""
    sums: dict[str, tuple[float, int]] = {}
    for start, stop, name in events:
        us, n = sums.get(name[:60], (0.0, 0))
        sums[name[:60]] = (us + stop - start, n + 1)
    return sums


def per_call(
    events: list[tuple[float, float, str]],
) -> tuple[list[float], list[float], list[int], dict[tuple[str, str], float]]:
    """From GPU events (start us, end us, name) sorted by start, split at idle gaps over 4 ms: per call the
    span and busy ms and the event count, and the idle us between consecutive events summed over every
    call by (event before, event after)."""
    calls: list[list[tuple[float, float, str]]] = [[]]
    last_end = events[0][0]
    for ev in events:
        if ev[0] - last_end > 4000.0:
            calls.append([])
        calls[-1].append(ev)
        last_end = max(last_end, ev[1])
    spans, busy, kernels = [], [], []
    gaps: dict[tuple[str, str], float] = {}
    for evs in calls:
        end, used = evs[0][0], 0.0
        for i, (start, stop, name) in enumerate(evs):
            if i and start > end:
                key = (evs[i - 1][2][:60], name[:60])
                gaps[key] = gaps.get(key, 0.0) + start - end
            used += max(0.0, stop - max(start, end))
            end = max(end, stop)
        spans.append((end - evs[0][0]) / 1000.0)
        busy.append(used / 1000.0)
        kernels.append(len(evs))
    return spans, busy, kernels, gaps


if __name__ == "__main__":
    raise SystemExit(main())
