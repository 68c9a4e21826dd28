"""The engine's expert modes side by side on the H200: bf16, FP8 through CUTLASS, FP8 through the fused Triton
kernels, FP8 text-only (bf16 experts freed), and those two with the attention projections in FP8 as well
(`MODES`), on the same full-size weights with levelled routing.

`python3 -m bench.fp8_modes --out DIR [--modes a,b,...] [--tiles-from tiles_best.json]` builds the
full-size engine (random bf16 weights, routers levelled as a trained router spreads tokens, fast path, CUDA
graphs up to 4,096 tokens) and, per mode in this order (text-only last: it cannot be undone):

- tok/s streaming 512-token requests at budget 65,536 and one 800-token request's `Engine.decide` p50/p99
  (`bench.experts.measure`);
- the answer drift from bf16 (max, p99, p50 |dp| over every option probability of `--drift` requests of
  the load mix, decided in batches at budget 32,768);
- the device memory allocated after the switch and the peak while serving (peak statistics reset after
  the switch), plus, for text-only, the peak of the switch itself;
- a kernel profile of five decisions of the 800-token request (`profile_800_<mode>.txt`) and of one
  eager batch of 512-token requests at budget 65,536 (`profile_batch_<mode>.txt`).

`--sm90` builds `engine.kernels.moe_fp8_sm90` (nvcc and ninja needed) and adds the mode
`fp8_text_only_attention_sm90` after `fp8_text_only_attention`: the same weights, with the expert calls its
`takes` accepts through the CUDA cluster kernels (a same-run A/B of the throughput at budget 65,536;
text-only, so it fits an 80 GB card).

`--tiles-from` launches the FP8 kernels with the shapes `bench.moe_fp8` found best (its
`tiles_best.json`) instead of the shipped ones. Prints JSON lines and writes `fp8_modes.jsonl` to
`--out`. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from bench.e2e_run import FastPathFlags
from bench.report import emit_line as emit

if TYPE_CHECKING:
    from engine.kernels import moe_fp8_sm90

MODES: dict[str, FastPathFlags] = {
    "bf16": {},
    "fp8_cutlass": {"fp8_experts": True, "fused_experts": False},
    "fp8_triton": {"fp8_experts": True},
    "fp8_triton_attention": {"fp8_experts": True, "fp8_attention": True},
    "fp8_attention_row_pass": {"fp8_experts": True, "fp8_attention": True},
    "fp8_attention_row_fused": {"fp8_experts": True, "fp8_attention": True},
    "fp8_text_only": {"fp8_experts": True, "text_only": True},
    "fp8_text_only_attention": {"fp8_experts": True, "text_only": True, "fp8_attention": True},
    "fp8_text_only_attention_sm90": {"fp8_experts": True, "text_only": True, "fp8_attention": True},
}
"""The expert modes, in the order they run (`enable_fast_path` arguments); text-only ones last: the bf16
experts cannot come back. `fp8_attention` also runs the attention projections in FP8."""
SM90_MODES = frozenset({"fp8_text_only_attention_sm90"})
"""Modes that run with the `moe_fp8_sm90` extension (`--sm90`; built once, before the first of them)."""
SCALING_OF = {"fp8_attention_row_pass": "row_pass", "fp8_attention_row_fused": "row_fused"}
"""Modes whose FP8 down GEMM applies the activations' scales another way than `moe_fp8.DOWN_SCALING`
(`moe_fp8.SCALINGS`; set before the graphs are captured)."""


def use_tiles(path: Path) -> dict[str, object]:
    """Launch the FP8 expert kernels with the shapes of `bench.moe_fp8`'s `tiles_best.json` (before any
    graph is captured); returns the file's contents."""
    from engine.kernels import moe_fp8
    from engine.kernels.tiles import MoeTiles, Tiles

    raw = json.loads(path.read_text())
    for regime, attr in (("small", "SMALL"), ("large", "LARGE")):
        if regime in raw:
            tiles = MoeTiles(Tiles(**raw[regime]["gate_up"]), Tiles(**raw[regime]["down"]))
            setattr(moe_fp8, attr, tiles)
    return dict(raw)


def sm90_extension(rows: list[str]) -> moe_fp8_sm90.Extension:
    """`engine.kernels.moe_fp8_sm90` built (or loaded from its build folder), timed on a `build` line of
    `rows` (the output file's, like every other line)."""
    from engine.kernels import moe_fp8_sm90

    t = time.perf_counter()
    ext = moe_fp8_sm90.build(moe_fp8_sm90.BUILD_DIR)
    emit(rows, kind="build", seconds=round(time.perf_counter() - t, 1))
    return ext


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--requests", type=int, default=1024, help="512-token requests per stream")
    p.add_argument("--drift", type=int, default=192, help="requests of the load mix for the drift")
    p.add_argument("--tiles-from", type=Path, default=None)
    p.add_argument(
        "--modes",
        default="bf16,fp8_triton,fp8_triton_attention,fp8_text_only_attention",
        help=f"comma-separated, from {','.join(MODES)} (run in that order; bf16 first for the drift)",
    )
    p.add_argument(
        "--sm90",
        action="store_true",
        help="also run fp8_text_only_attention_sm90 (moe_fp8_sm90's CUDA kernels; nvcc and ninja needed)",
    )
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []

    from bench.engine import run_info
    from bench.experts import measure, probabilities, profile_batch, profile_one
    from bench.load import make_pool
    from bench.workload import build_engine, make_request
    from engine.batching.cut import BatchLimits
    from engine.kernels import moe_fp8
    from engine.model.graphs import default_buckets
    from engine.runner import EngineConfig

    if args.tiles_from is not None and args.tiles_from.exists():
        emit(rows, kind="tiles", fp8=use_tiles(args.tiles_from))
    t0 = time.perf_counter()
    config = EngineConfig(device="cuda", dtype="bfloat16", limits=BatchLimits(65536, 256))
    engine = build_engine(config, routing="levelled")
    emit(rows, **run_info(t0))
    buckets = default_buckets(4096)
    rng = random.Random(0)
    reqs512 = [make_request(rng, engine, 512) for _ in range(args.requests)]
    one = make_request(rng, engine, 800)
    pool = [engine.prepare(r) for r in make_pool(engine, random.Random(5), args.drift)]
    batch_pool = [engine.prepare(r) for r in reqs512[:160]]
    bf16: list[float] = []
    chosen = set(args.modes.split(",")) | (SM90_MODES if args.sm90 else set())
    if unknown := chosen - set(MODES):
        p.error(f"unknown modes {sorted(unknown)}")
    if "bf16" not in chosen:
        p.error("bf16 is every drift's reference: include it")
    shipped_scaling = moe_fp8.DOWN_SCALING
    for mode, kwargs in ((m, MODES[m]) for m in MODES if m in chosen):
        moe_fp8.DOWN_SCALING = SCALING_OF.get(mode, shipped_scaling)
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        ext = sm90_extension(rows) if mode in SM90_MODES else None
        engine.model.enable_fast_path(graph_buckets=buckets, sm90_experts=ext, **kwargs)
        torch.cuda.synchronize()
        switch_s = time.perf_counter() - t
        switch_peak = torch.cuda.max_memory_allocated()
        torch.cuda.empty_cache()
        allocated = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        probs = probabilities(engine, pool, 32768)
        if not bf16:
            bf16 = probs
        dp = sorted(abs(a - b) for a, b in zip(bf16, probs, strict=True))
        row = measure(engine, reqs512, one)
        emit(
            rows,
            kind="mode",
            mode=mode,
            routing="levelled",
            switch_s=round(switch_s, 1),
            switch_peak_gb=round(switch_peak / 1e9, 2),
            allocated_gb=round(allocated / 1e9, 2),
            serving_peak_gb=round(torch.cuda.max_memory_allocated() / 1e9, 2),
            drift_probabilities=len(dp),
            drift_max_abs_dp=round(dp[-1], 6),
            drift_p99_abs_dp=round(dp[int(0.99 * (len(dp) - 1))], 6),
            drift_p50_abs_dp=round(dp[len(dp) // 2], 7),
            **row,
        )
        profile_one(engine, one, out / f"profile_800_{mode}.txt")
        profile_batch(engine, batch_pool, 65536, out / f"profile_batch_{mode}.txt")
    (out / "fp8_modes.jsonl").write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
