"""The MoE glue kernels around the experts on the H200: grouping the token-expert pairs by expert, and the
per-token sum of the k expert outputs folded into the residual add and RMSNorm (`engine.kernels.elementwise`).

`python3 -m bench.moe_glue --out DIR` routes T tokens uniformly at random (each token picks 8 distinct
experts of 128, as in `bench.moe_kernels`) and prints, as JSON lines, microseconds per call of CUDA-graph
replays (`bench.timing.graph_us`):

1. `grouping`: per T, the counting sort `moe.group_by_expert` for each scan block and
   `group_by_expert_inverse`; `exact` says whether the sort equals torch's stable argsort and bincount.
2. `pair_sum`: per T, `elementwise.add_pairs_rms_norm` (rows in pair order, and read through an inverse
   index) against two launches, `combine` then `add_rms_norm`, with the bytes each moves per second
   (`combine` is the fused kernel without the residual).

Writes `moe_glue.jsonl` to `--out`. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
from functools import partial
from pathlib import Path

import torch

from bench.moe_kernels import EXPERTS, HIDDEN, TOP_K, kernel_info
from bench.report import emit_line as emit
from bench.timing import graph_us
from engine.kernels import elementwise, moe

BLOCKS = (1024, 2048, 4096, 8192, 16384)
"""Scan blocks of `group_by_expert` to time (ids per step of each expert's two scans)."""


def grouping(rows: list[str], t: int, gen: torch.Generator) -> None:
    """One `grouping` line for T tokens."""
    top_i = torch.rand(t, EXPERTS, generator=gen, device="cuda").argsort(dim=1)[:, :TOP_K].int()  # (T, k)
    flat = top_i.reshape(-1)
    order, counts = moe.group_by_expert(top_i, EXPERTS)
    exact = torch.equal(order.long(), torch.argsort(flat, stable=True)) and torch.equal(
        counts.long(), torch.bincount(flat, minlength=EXPERTS)
    )
    row: dict[str, object] = {"kind": "grouping", "tokens": t, "pairs": flat.numel(), "exact": exact}
    for block in BLOCKS:
        row[f"group_by_expert_b{block}_us"] = round(
            graph_us(partial(moe.group_by_expert, top_i, EXPERTS, block=block)), 1
        )
    row["group_by_expert_inverse_us"] = round(
        graph_us(partial(moe.group_by_expert_inverse, top_i, EXPERTS)), 1
    )
    emit(rows, **row)


def pair_sum(rows: list[str], t: int, gen: torch.Generator) -> None:
    """One `pair_sum` line for T tokens (hidden 2,048, k = 8, bf16)."""
    x = torch.randn(t, HIDDEN, device="cuda", generator=gen).bfloat16()
    w = torch.randn(HIDDEN, device="cuda", generator=gen).bfloat16()
    pairs = torch.randn(t * TOP_K, HIDDEN, device="cuda", generator=gen).bfloat16()  # (T k, H) pair order
    inv = torch.randperm(t * TOP_K, device="cuda", generator=gen).int()
    by_expert = torch.empty_like(pairs)
    by_expert[inv.long()] = pairs  # (S, H): pair p in row inv[p]

    def two_launches() -> object:
        return elementwise.add_rms_norm(x, elementwise.combine(pairs, None, TOP_K), w, 1e-6)

    us = {
        "fused_us": graph_us(partial(elementwise.add_pairs_rms_norm, x, pairs, None, TOP_K, w, 1e-6)),
        "fused_indexed_us": graph_us(
            partial(elementwise.add_pairs_rms_norm, x, by_expert, inv, TOP_K, w, 1e-6)
        ),
        "combine_then_add_rms_norm_us": graph_us(two_launches),
    }
    fused_bytes = (t * TOP_K + 3 * t) * HIDDEN * 2  # read the rows and x, write y and h
    emit(
        rows,
        kind="pair_sum",
        tokens=t,
        **{name: round(v, 1) for name, v in us.items()},
        fused_tb_s=round(fused_bytes / us["fused_us"] / 1e6, 2),
    )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--tokens", default="807,4096,16384,65536")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []
    emit(rows, **kernel_info())
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.inference_mode():
        for t in (int(t) for t in args.tokens.split(",")):
            grouping(rows, t, gen)
            pair_sum(rows, t, gen)
    (out / "moe_glue.jsonl").write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
