"""Run by `test_packed_attention.py` in a child process under `TRITON_INTERPRET=1`: the packed attention
kernel (`engine.kernels.attention.attention_triton`) on CPU tensors against `attention_reference`, and the
kernel with q normalised and rotated on load (`attention_qkv_triton`, k and v from
`elementwise.kv_norm_rope`) against the same norm, rotation and attention in plain PyTorch. Prints one line
per case, `case <lengths> <tiles> max_abs_diff <d>` (`qkv case ...` for the second), and exits 1 when a
case differs by more than 1e-5."""

from __future__ import annotations

import os
import sys

import torch

from engine.kernels import attention, elementwise
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
    failed += qkv_cases(gen, tiles)
    return 1 if failed else 0


def _norm_rope(x: torch.Tensor, w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    n = elementwise.rms_norm_reference(x, w, 1e-6)  # (T, h, d)
    half = x.shape[-1] // 2
    rotated = torch.cat((-n[..., half:], n[..., :half]), dim=-1)
    return n * cos[:, None, :] + rotated * sin[:, None, :]


def qkv_cases(gen: torch.Generator, tiles: tuple[AttentionTiles, ...]) -> int:
    """The fused-q path on float32 (the interpreter's bf16 rounds differently from the GPU's): 8 q heads, 2
    kv heads of 16; returns the number of failing cases."""
    failed = 0
    hq, hk, d = 8, 2, 16
    for lengths in ([1], [5, 16, 33], [40, 0, 7, 64]):
        t = sum(lengths)
        qkv = torch.randn(t, (hq + 2 * hk) * d, generator=gen) * 3.0
        qw, kw = (torch.rand(d, generator=gen) + 0.5 for _ in range(2))
        angle = torch.rand(t, d // 2, generator=gen) * 6.0
        cos, sin = (torch.cat((f(angle), f(angle)), dim=-1) for f in (torch.cos, torch.sin))  # (T, d)
        q_raw, k_raw, v = torch.split(qkv, [hq * d, hk * d, hk * d], dim=-1)
        q = _norm_rope(q_raw.reshape(t, hq, d), qw, cos, sin)
        k = _norm_rope(k_raw.reshape(t, hk, d), kw, cos, sin)
        cu = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
        ref = attention.attention_reference(q, k, v.reshape(t, hk, d), cu)
        k_got, v_got = elementwise.kv_norm_rope(qkv, kw, cos, sin, hq, hk, 1e-6)
        kv_diff = max(float((k_got - k).abs().max()), float((v_got - v.reshape(t, hk, d)).abs().max()))
        norm = attention.QNorm(qw, 1e-6, cos, sin)
        for tile in tiles:
            got = attention.attention_qkv_triton(qkv, norm, k_got, v_got, cu, max(lengths), tile)
            diff = max(float((got - ref).abs().max()), kv_diff)
            print(f"qkv case {lengths} {tile.block_m}x{tile.block_n}/{tile.group} max_abs_diff {diff:.3e}")
            failed += not diff <= 1e-5
    return failed


if __name__ == "__main__":
    sys.exit(main())
