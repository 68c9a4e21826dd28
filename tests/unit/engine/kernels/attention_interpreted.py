"""Run by `test_packed_attention.py` in a child process under `TRITON_INTERPRET=1`: the packed attention
kernel (`engine.kernels.attention.attention_triton`) on CPU tensors against `attention_reference`. Prints
one line per case, `case <lengths> <tiles> max_abs_diff <d>`, and exits 1 when a case differs by more
than 1e-5."""

from __future__ import annotations

import os
import sys

import torch

from engine.kernels import attention
from engine.kernels.tiles import AttentionTiles
from tests.unit.engine.kernels.interpreter_patch import index_scalars_as_numpy_2_4_allows


def main() -> int:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1"
    index_scalars_as_numpy_2_4_allows()
    gen = torch.Generator().manual_seed(0)
    failed = 0
    # Lengths: one token, shorter than a block, block multiples, a long record after short ones, and an
    # empty record (padding slots of a CUDA graph); tiles with block_m above, equal to and below block_n.
    cases = ([1], [5, 16, 33], [40, 0, 7, 64], [3, 70])
    # and query heads folded into a program's rows (group 2 and 4 of the 4 q heads per kv head).
    tiles = (
        AttentionTiles(16, 16, 4, 1),
        AttentionTiles(32, 16, 4, 1),
        AttentionTiles(16, 32, 4, 1),
        AttentionTiles(32, 16, 4, 1, group=4),
        AttentionTiles(32, 16, 4, 1, group=8),
        AttentionTiles(16, 32, 4, 1, group=2),
    )
    for lengths in cases:
        t = sum(lengths)
        q, k, v = (torch.randn(t, h, 16, generator=gen) for h in (8, 2, 2))
        cu = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
        ref = attention.attention_reference(q, k, v, cu)
        for tile in tiles:
            got = attention.attention_triton(q, k, v, cu, max(lengths), tile)
            diff = float((got - ref).abs().max())
            print(f"case {lengths} {tile.block_m}x{tile.block_n}/{tile.group} max_abs_diff {diff:.3e}")
            failed += not diff <= 1e-5
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
