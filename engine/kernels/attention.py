"""Causal attention over records packed back to back on one token axis (the fast path's multi-record
attention), through one Triton kernel on the GPU (`engine.kernels.attention_triton`), with the PyTorch
twin it is tested against.

The fast path packs a batch's records into one axis `T` with boundaries `cu_seqlens`; every token attends
to the earlier tokens of its own record only.

Contract: q (T, hq, d), k and v (T, hk, d), contiguous, hq a multiple of hk (grouped-query attention),
the softmax scale 1 / sqrt(d); `cu_seqlens` (N+1,) int32 on the same device, `max_seqlen` at least the
longest record. The result is (T, hq, d) in q's dtype. `attention` takes the Triton kernel for CUDA tensors
whose head size `supported` accepts, and `attention_reference` (one causal SDPA call per record, which
syncs) for anything else; `attention_triton` also runs under Triton's interpreter (`TRITON_INTERPRET=1`)
on CPU tensors, for tests.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F  # noqa: N812

from engine.kernels.tiles import AttentionTiles, shipped

try:  # Triton ships with CUDA builds of torch; CPU-only installs fall back to PyTorch.
    import triton

    from engine.kernels.attention_triton import _packed_attention_kernel

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False


TILES = shipped().attention
"""The launch shape of `attention` on the GPU (`engine.kernels.tiles`, "attention")."""


def supported(head_dim: int) -> bool:
    """Whether the kernel takes this head size (a power of two from 16: tensor-core steps, `tl.arange`)."""
    return HAVE_TRITON and head_dim >= 16 and head_dim & (head_dim - 1) == 0


def attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor
) -> torch.Tensor:
    """One causal SDPA call per record (CPU runs and tests): (T, hq, d)."""
    outs = []
    for a, b in itertools.pairwise(cu_seqlens.tolist()):
        qi, ki, vi = (t[a:b].transpose(0, 1) for t in (q, k, v))  # (heads, n, d)
        oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, enable_gqa=True)  # (hq, n, d)
        outs.append(oi.transpose(0, 1))
    return torch.cat(outs, dim=0) if outs else torch.empty_like(q)  # (T, hq, d)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int
) -> torch.Tensor:
    """Causal attention within each record of the pack: (T, hq, d). See the module docstring."""
    if not (q.is_cuda and supported(q.shape[-1])):
        return attention_reference(q, k, v, cu_seqlens)
    return attention_triton(q, k, v, cu_seqlens, max_seqlen)


def attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    tiles: AttentionTiles = TILES,
) -> torch.Tensor:
    """`attention` through the Triton kernel on q's device (CUDA, or CPU under Triton's interpreter).
    `tiles` overrides the launch shape (benchmarks, interpreter tests)."""
    t, hq, d = q.shape
    hk = k.shape[1]
    if hq % hk or k.shape != v.shape or k.shape[0] != t:
        raise ValueError(f"attention needs q (T, hq, d), k = v (T, hk, d), hk | hq; got {q.shape}, {k.shape}")
    group = math.gcd(tiles.group, hq // hk)  # the tiny release has 2 q heads per kv head, the full one 8
    if tiles.block_m % group:
        raise ValueError(f"block_m {tiles.block_m} is not a multiple of group {group}")
    out = torch.empty_like(q)
    records = cu_seqlens.numel() - 1
    if not t or records <= 0 or max_seqlen <= 0:
        return out
    blocks = triton.cdiv(max_seqlen, tiles.block_m // group)
    _packed_attention_kernel[(blocks, hq // group, records)](
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        out,
        cu_seqlens,
        math.log2(math.e) / math.sqrt(d),
        blocks,
        hq=hq,
        hk=hk,
        d=d,
        block_m=tiles.block_m,
        block_n=tiles.block_n,
        group=group,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return out
