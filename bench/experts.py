"""Expert-side benchmarks on the H200: skewed routing, and the opt-in FP8 expert mode against bf16.

`python3 -m bench.experts --out DIR` builds the full-size engine (random bf16 weights, fast path, CUDA
graphs up to 4,096 tokens) and measures, in one process:

1. Skew. Random router weights do not spread tokens evenly: the hidden states share a common direction,
   so in most layers one expert is picked by nearly every token (the first row, "random router"). Each
   router gets a bias: first one that levels every expert's mean logit over a 8,192-token batch (skew 1:
   near-uniform load, the best case for grouped GEMMs), then, on top, a raise of one "hot" expert per
   layer, calibrated by bisection so that it receives `skew` x the average expert load. Per skew:
   streaming 512-token requests at budget 65,536 (tok/s), one
   800-token request (CUDA graph, p50/p99 ms), and the load actually reached (hot / average, and the
   busiest expert / average, means over layers).
   At skew 1 the same two figures again with the bf16 experts unfused (CUTLASS grouped GEMMs with the
   gather, SwiGLU and combine kernels around them) against the default fused Triton path
   (`engine.kernels.moe`),
   and with torch's varlen FlashAttention 2 against the packed Triton attention (`engine.kernels.attention`).
2. FP8 experts (`engine.kernels.fp8`), on the same weights at skew 1: the same two figures, the device memory
   the FP8 copies take, and the answer drift against bf16 (max and p99 |dp| over every option
   probability of `--drift` requests of the load mix, each decided in batches at budget 32,768).

Prints JSON lines and writes `experts.jsonl` to `--out`. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.report import emit_line as emit
from bench.routing import level, router_biases, routes

HOT_STRIDE = 37  # hot expert of layer l: (l * 37) % E, so layers differ


def loads(engine: Any, batch: Any, experts: int) -> tuple[list[float], list[float]]:
    """Per layer: hot expert load / average, busiest expert load / average, for one eager forward."""
    hot, busiest = [], []
    for layer, (_, ids) in enumerate(routes(engine, batch)):
        counts = torch.bincount(ids.reshape(-1).long(), minlength=experts).float()
        avg = ids.numel() / experts
        hot.append(float(counts[(layer * HOT_STRIDE) % experts]) / avg)
        busiest.append(float(counts.max()) / avg)
    return hot, busiest


def calibrate(
    engine: Any, biases: list[torch.Tensor], batch: Any, skew: float, steps: int = 14
) -> list[float]:
    """Level the routers, then raise each layer's hot-expert bias so that its load is `skew` x average
    (bisection per layer on top of the levelling bias)."""
    experts = biases[0].numel()
    level(engine, biases, batch)
    if skew <= 1.0:
        return loads(engine, batch, experts)[0]
    base = [float(b[(layer * HOT_STRIDE) % experts]) for layer, b in enumerate(biases)]
    lo = [0.0] * len(biases)
    hi = [8.0] * len(biases)
    hot: list[float] = []
    for _ in range(steps):
        for layer, b in enumerate(biases):
            b[(layer * HOT_STRIDE) % experts] = base[layer] + (lo[layer] + hi[layer]) / 2
        hot, _ = loads(engine, batch, experts)
        for layer, ratio in enumerate(hot):
            mid = (lo[layer] + hi[layer]) / 2
            if ratio < skew:
                lo[layer] = mid
            else:
                hi[layer] = mid
    return hot


def biased_engine(graph_tokens: int = 4096) -> tuple[Any, list[torch.Tensor], tuple[int, ...]]:
    """(engine, router biases, graph buckets): the full-size engine at budget 65,536 with a zero bias on
    every router, added before the CUDA graphs (buckets up to `graph_tokens`; the service's go to 8,192)
    are captured, since they read the bias tensors in place."""
    from bench.workload import build_engine
    from engine.batching.cut import BatchLimits
    from engine.model.graphs import default_buckets
    from engine.runner import EngineConfig

    config = EngineConfig(device="cuda", dtype="bfloat16", limits=BatchLimits(65536, 256), graph_buckets=())
    engine = build_engine(config, routing="random")  # levelled and skewed here, by `calibrate`
    biases = router_biases(engine.model)
    buckets = default_buckets(graph_tokens)
    engine.model.enable_fast_path(graph_buckets=buckets)
    return engine, biases, buckets


def measure(engine: Any, reqs512: Sequence[Any], one: Any) -> dict[str, float]:
    from bench.engine import latency, stream

    stream(engine, reqs512[:128], 65536, 256)  # warm this mode's kernels
    r = stream(engine, reqs512, 65536, 256)
    lat = {k: round(v, 2) for k, v in latency(engine, one, 20).items()}
    return {
        "tok_s": round(r["tok_s"]),
        "steady_tok_s": round(r["steady_tok_s"]),
        "batch_ms_p50": round(r["batch_ms_p50"], 1),
        # the slowest batch (p99 of fewer than 100 batches): a stall shows here, not in the p50
        "batch_ms_p99": round(r["batch_ms_p99"], 1),
        **{f"one800_{k}": v for k, v in lat.items()},
    }


def probabilities(engine: Any, prepared: Sequence[Any], budget: int) -> list[float]:
    """Every option probability of `prepared`, decided in batches of at most `budget` tokens."""
    flat: list[float] = []
    batch: list[Any] = []
    size = 0

    def flush() -> None:
        result = engine.run(engine.stage(batch))
        for per_question in result.probabilities:
            for qid in sorted(per_question):
                flat.extend(float(v) for v in per_question[qid])

    for p in prepared:
        if batch and size + p.num_tokens > budget:
            flush()
            batch, size = [], 0
        batch.append(p)
        size += p.num_tokens
    if batch:
        flush()
    return flat


def profile_one(engine: Any, request: Any, path: Path) -> None:
    """Kernel time of five decisions of one request (CUDA graph replay), by kernel, to `path`."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        engine.decide([request])
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            engine.decide([request])
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=90)
    path.write_text(table)
    print(table[:5000], flush=True)


def profile_batch(engine: Any, prepared: Sequence[Any], budget: int, path: Path) -> None:
    """Kernel time of one eager `Engine.execute` of the first of `prepared` that fit in `budget` tokens
    (after one warm-up run), by kernel, to `path`."""
    from torch.profiler import ProfilerActivity, profile

    batch, size = [], 0
    for rec in prepared:
        if size + rec.num_tokens > budget:
            break
        batch.append(rec)
        size += rec.num_tokens
    engine.execute(batch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.execute(batch)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=90)
    path.write_text(f"{len(batch)} records, {size} tokens, one execute\n{table}")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--requests", type=int, default=512, help="512-token requests per stream")
    p.add_argument("--drift", type=int, default=256, help="requests of the load mix for the FP8 drift")
    p.add_argument("--skews", default="1,4,8")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []

    from bench.engine import run_info, stream
    from bench.load import make_pool
    from bench.workload import make_request

    t0 = time.perf_counter()
    engine, biases, buckets = biased_engine()
    emit(rows, **run_info(t0))
    rng = random.Random(0)
    reqs512 = [make_request(rng, engine, 512) for _ in range(args.requests)]
    one = make_request(rng, engine, 800)
    probe = [engine.prepare(r).encoded for r in reqs512[:16]]
    with torch.inference_mode():
        calib_batch = engine.model.collate(probe)

    _, raw_busiest = loads(engine, calib_batch, biases[0].numel())
    emit(
        rows,
        kind="skew",
        skew="random router (no levelling)",
        busiest_over_avg_mean=round(statistics.mean(raw_busiest), 2),
        **measure(engine, reqs512, one),
    )
    for skew in (float(s) for s in args.skews.split(",")):
        t = time.perf_counter()
        hot = calibrate(engine, biases, calib_batch, skew)
        _, busiest = loads(engine, calib_batch, biases[0].numel())
        emit(
            rows,
            kind="skew",
            skew=skew,
            hot_over_avg_mean=round(statistics.mean(hot), 2),
            hot_over_avg_min=round(min(hot), 2),
            hot_over_avg_max=round(max(hot), 2),
            busiest_over_avg_mean=round(statistics.mean(busiest), 2),
            calibrate_s=round(time.perf_counter() - t, 1),
            **measure(engine, reqs512, one),
        )
        if skew == 1.0:
            mixed = make_pool(engine, random.Random(6), args.requests)  # the load mix, 200-1,500 tokens
            stream(engine, mixed[:64], 65536, 256)
            r = stream(engine, mixed, 65536, 256)
            emit(
                rows,
                kind="mixed",
                skew=skew,
                tok_s=round(r["tok_s"]),
                steady_tok_s=round(r["steady_tok_s"]),
                batch_ms_p50=round(r["batch_ms_p50"], 1),
            )
            # the same weights and routing through the unfused CUTLASS experts
            engine.model.enable_fast_path(graph_buckets=buckets, fused_experts=False)
            emit(rows, kind="skew", skew=skew, experts="unfused (CUTLASS)", **measure(engine, reqs512, one))
            profile_one(engine, one, out / "profile_800_unfused.txt")
            # and through torch's varlen FlashAttention 2 instead of the packed Triton attention
            engine.model.enable_fast_path(graph_buckets=buckets, triton_attention=False)
            row = measure(engine, reqs512, one)
            emit(rows, kind="skew", skew=skew, attention="varlen FlashAttention 2", **row)
            engine.model.enable_fast_path(graph_buckets=buckets)
    for b in biases:
        b.zero_()

    pool = [engine.prepare(r) for r in make_pool(engine, random.Random(5), args.drift)]
    bf16 = probabilities(engine, pool, 32768)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    t = time.perf_counter()
    engine.model.enable_fast_path(graph_buckets=buckets, fp8_experts=True)
    torch.cuda.synchronize()
    setup_s = time.perf_counter() - t
    fp8_bytes = torch.cuda.memory_allocated() - before
    q = probabilities(engine, pool, 32768)
    dp = sorted(abs(a - b) for a, b in zip(bf16, q, strict=True))
    emit(
        rows,
        kind="fp8",
        routing="random router",
        quantize_and_capture_s=round(setup_s, 1),
        fp8_copies_gb=round(fp8_bytes / 1e9, 2),
        peak_gb=round(torch.cuda.max_memory_allocated() / 1e9, 1),
        drift_probabilities=len(dp),
        drift_max_abs_dp=round(dp[-1], 5),
        drift_p99_abs_dp=round(dp[int(0.99 * (len(dp) - 1))], 5),
        drift_p50_abs_dp=round(dp[len(dp) // 2], 6),
        **measure(engine, reqs512, one),
    )
    level(engine, biases, calib_batch)  # FP8 again, with near-uniform routing (every expert read)
    emit(rows, kind="fp8", routing="levelled", **measure(engine, reqs512, one))
    profile_one(engine, one, out / "profile_800_fp8_levelled.txt")
    engine.model.enable_fast_path(graph_buckets=buckets)
    emit(rows, kind="bf16_again", routing="levelled", **measure(engine, reqs512, one))
    profile_one(engine, one, out / "profile_800.txt")
    (out / "experts.jsonl").write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
