"""Run by `test_moe.py` in a child process under `TRITON_INTERPRET=1`: the fused FP8 expert kernels
(`engine.kernels.moe_fp8.experts_pairs_fp8`) on CPU tensors against their float32 twin
(`experts_pairs_fp8_reference`) with the same down scaling (`moe_fp8.SCALINGS`), row by row in pair order.
Prints one line per case, `case <args> tiles <n> scaling <s> rel_diff <d> rel_norm <r> vs_bf16 <b>`, and
exits 1 when a case is off, or when the two row scalings (a pass of their own, or fused in the down
kernel) give different bits.

The kernels and the twin sum in different orders, so an activation on a rounding edge of e4m3 could land
one step apart: the norm of the difference must stay within 1e-4 of the twin's, no element may be off by
more than one e4m3 step (1/8 of the largest output), and the bf16 experts must be within 20% (FP8's own
error). Faults of indexing (rows, experts, columns, scale groups, pair order) give errors of the outputs'
own size. The interpreter's own downcasts are replaced by torch's (`interpreter_patch`)."""

from __future__ import annotations

import os
import sys

import torch

from engine.kernels import fp8, moe, moe_fp8
from engine.kernels.tiles import MoeTiles, Tiles
from tests.unit.engine.kernels.interpreter_patch import (
    fp_downcasts_rounded_as_the_gpu_does,
    index_scalars_as_numpy_2_4_allows,
)


def main() -> int:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1"
    index_scalars_as_numpy_2_4_allows()
    fp_downcasts_rounded_as_the_gpu_does()
    gen = torch.Generator().manual_seed(0)
    tiles = (
        MoeTiles(Tiles(16, 32, 32, 4, 2), Tiles(16, 32, 32, 4, 2)),
        MoeTiles(Tiles(32, 64, 64, 4, 2, tma=True), Tiles(16, 64, 32, 4, 2, tma=True)),
    )
    failed = 0
    # (tokens, hidden, inter, experts, k): an empty expert, an expert with more rows than one tile, a
    # non-power-of-two expert count, and the tiny release's sizes (group 32).
    for t, hidden, inter, experts, k in ((7, 64, 32, 4, 2), (50, 128, 64, 8, 2), (33, 64, 96, 5, 3)):
        x, q8, order, counts, top_w, bf16 = _case(gen, t, hidden, inter, experts, k)
        for scaling in moe_fp8.SCALINGS:
            ref = moe_fp8.experts_pairs_fp8_reference(x, order, counts, top_w, q8, scaling).float()
            scale = float(ref.abs().max())
            for n, tile in enumerate(tiles):
                got = moe_fp8.experts_pairs_fp8(x, order, counts, top_w, q8, tile, scaling).float()
                rel = float((got - ref).abs().max()) / scale
                norm = float((got - ref).norm() / ref.norm())
                vs_bf16 = float((got - bf16).abs().max()) / scale
                print(
                    f"case {(t, hidden, inter, experts, k)} tiles {n} scaling {scaling} rel_diff {rel:.3e} "
                    f"rel_norm {norm:.3e} vs_bf16 {vs_bf16:.3e}"
                )
                failed += rel > 0.125 or norm > 1e-4 or vs_bf16 > 0.2
        for n, tile in enumerate(tiles):
            pass_ = moe_fp8.experts_pairs_fp8(x, order, counts, top_w, q8, tile, "row_pass")
            fused = moe_fp8.experts_pairs_fp8(x, order, counts, top_w, q8, tile, "row_fused")
            same = torch.equal(pass_, fused)
            print(f"case {(t, hidden, inter, experts, k)} tiles {n} row_pass == row_fused {same}")
            failed += not same
    # The engine's default: a regime per GEMM (`tiles_for`, `down_tiles_for`), here the gate/up GEMM on
    # `LARGE`'s shape and the down GEMM on `SMALL`'s with its fused row scaling (thresholds lowered to this
    # size: 12.5 rows an expert).
    moe_fp8.LARGE_FROM_ROWS_PER_EXPERT, moe_fp8.DOWN_LARGE_FROM_ROWS_PER_EXPERT = 4, 64
    x, q8, order, counts, top_w, bf16 = _case(gen, 50, 128, 64, 8, 2)
    split = moe_fp8.tiles_for(100, 8) is moe_fp8.LARGE and moe_fp8.down_tiles_for(100, 8) is moe_fp8.SMALL
    got = moe_fp8.experts_pairs_fp8(x, order, counts, top_w, q8).float()
    ref = moe_fp8.experts_pairs_fp8_reference(x, order, counts, top_w, q8, "row_fused").float()
    rel = float((got - ref).abs().max()) / float(ref.abs().max())
    norm = float((got - ref).norm() / ref.norm())
    print(f"case split gate/up large, down small {split} rel_diff {rel:.3e} rel_norm {norm:.3e}")
    failed += not split or rel > 0.125 or norm > 1e-4
    return 1 if failed else 0


def _case(
    gen: torch.Generator, t: int, hidden: int, inter: int, experts: int, k: int
) -> tuple[torch.Tensor, fp8.Fp8Experts, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, the e4m3 experts, the pairs by expert, the counts, the routing weights and the bf16 experts'
    output of one random case: expert 0 gets nothing, expert 1 nearly every token (more rows than a tile)."""
    x = torch.randn(t, hidden, generator=gen).to(torch.bfloat16)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    down = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    q8 = fp8.quantize_experts(gate_up, down)
    logits = torch.randn(t, experts, generator=gen)
    logits[:, 0] = -1e9
    logits[:, 1] += 3.0
    top_w, top_i = torch.topk(torch.softmax(logits, -1), k, -1)
    top_w = top_w / top_w.sum(-1, keepdim=True)
    flat = top_i.reshape(-1)
    order = torch.argsort(flat).to(torch.int32)
    counts = torch.bincount(flat, minlength=experts).to(torch.int32)
    bf16 = moe.experts_pairs_reference(
        x, order, counts, top_w, gate_up.to(torch.bfloat16), down.to(torch.bfloat16)
    ).float()
    return x, q8, order, counts, top_w, bf16


if __name__ == "__main__":
    sys.exit(main())
