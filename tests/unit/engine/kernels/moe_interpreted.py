"""Run by `test_moe.py` in a child process under `TRITON_INTERPRET=1`: the fused MoE Triton kernels
(`engine.kernels.moe.experts_pairs_triton`) on CPU tensors against
`engine.kernels.moe.experts_pairs_reference`, row by row in pair order. Prints one line per case,
`case <args> max_abs_diff <d> scale <s>`, and exits 1 when a case differs by more than 1e-5."""

from __future__ import annotations

import os
import sys

import torch

from engine.kernels import moe
from engine.kernels.tiles import MoeTiles, Tiles
from tests.unit.engine.kernels.interpreter_patch import index_scalars_as_numpy_2_4_allows


def main() -> int:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1"
    index_scalars_as_numpy_2_4_allows()
    gen = torch.Generator().manual_seed(0)
    tiles = (
        MoeTiles(Tiles(16, 32, 32, 4, 2), Tiles(16, 32, 16, 4, 2)),
        MoeTiles(Tiles(32, 16, 64, 4, 2), Tiles(64, 64, 32, 4, 2)),
        MoeTiles(Tiles(16, 32, 32, 4, 2, tma=True), Tiles(16, 32, 16, 4, 2, tma=True)),
    )
    failed = 0
    # (tokens, hidden, inter, experts, k): a non-power-of-two expert count, an empty expert, an expert
    # with more rows than one tile, and the tiny release's sizes.
    for t, hidden, inter, experts, k in ((7, 64, 32, 4, 2), (50, 128, 64, 8, 2), (33, 64, 48, 5, 3)):
        x = torch.randn(t, hidden, generator=gen)
        gate_up = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
        down = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
        logits = torch.randn(t, experts, generator=gen)
        logits[:, 0] = -1e9  # expert 0 gets nothing
        logits[:, 1] += 3.0  # expert 1 gets nearly every token (more rows than a tile)
        top_w, top_i = torch.topk(torch.softmax(logits, -1), k, -1)
        top_w = top_w / top_w.sum(-1, keepdim=True)
        flat = top_i.reshape(-1)
        order = torch.argsort(flat)
        counts = torch.bincount(flat, minlength=experts).to(torch.int32)
        ref = moe.experts_pairs_reference(x, order, counts, top_w, gate_up, down)
        for tile in tiles:
            got = moe.experts_pairs_triton(x, order, counts, top_w, gate_up, down, tile)
            diff = float((got - ref).abs().max())
            scale = float(ref.abs().max())
            print(f"case {(t, hidden, inter, experts, k)} max_abs_diff {diff:.3e} scale {scale:.3f}")
            failed += diff > 1e-5
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
