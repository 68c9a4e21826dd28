"""Causal attention of equal-length records through a dense (rows, length) layout, for cuDNN on the GPU.

The fast path packs records back to back and runs variable-length FlashAttention 2 over them. A CUDA
graph replay of one record instead runs its whole token bucket as one dense causal attention: the record
first, the bucket's padding behind it. Under the causal mask no record token ever reads a later column,
so the padding is never read by the record, needs no zeroing, and the record gets what per-record
attention gives it. On the H200 cuDNN's dense kernel takes 28.1 us for one 896-token record against 50.4 us
for varlen FlashAttention 2 (`bench.moe_kernels`, graph replays).

Measured and left out (BENCHMARKS.md, "Engine, round three"): the same layout for eager batches of many
records. cuDNN was 2.65x faster per call at 128 x 512 tokens in graph replays, yet the eager stream got
slower (889 against 789 ms per 65,536-token batch), and a never-seen shape costs a cuDNN plan of 42-572 ms.

Contract: q (T, hq, d), k and v (T, hk, d) with hq a multiple of hk (grouped-query attention) and
T = rows x length; the result is (T, hq, d). On CPU PyTorch's math attention runs the same layout (tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch.nn.attention import SDPBackend, sdpa_kernel


@dataclass(frozen=True, slots=True)
class DenseLayout:
    """The packed axis read as `rows` records of `length` tokens each (rows x length = T)."""

    rows: int
    length: int


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: DenseLayout) -> torch.Tensor:
    """Causal attention within each row of `layout`: (T, hq, d)."""
    rows, length = layout.rows, layout.length
    qd, kd, vd = (x.view(rows, length, x.shape[1], x.shape[2]).transpose(1, 2) for x in (q, k, v))
    if q.is_cuda:
        # cuDNN alone, without `set_priority=True`: with it, the GPU tests saw transformers' media path
        # change (padded media alone vs mixed went from 0 to 2.10e-03) although the probe in
        # `bench.moe_kernels` found torch's priority order restored afterwards; the cause is not known.
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, enable_gqa=True)
    else:
        out = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, enable_gqa=True)
    return out.transpose(1, 2).reshape(q.shape)  # (T, hq, d)
