"""Fused elementwise kernels for the GPU fast path (Triton), each with a plain-PyTorch twin for CPU.

Profiling the packed decoder on the H200 (64 x 512 tokens) showed the memory-bound glue between the
GEMMs taking more time than the expert GEMMs themselves. Each kernel here makes one coalesced pass:

- `add_rms_norm`: residual add and RMSNorm of the sum, (T, H) -> (T, H), (T, H).
- `swiglu_weighted`: silu(gate) * up * routing weight, (S, 2I) -> (S, I).
- `qk_norm_rope`: split fused QKV, per-head RMSNorm of q and k, rotary embedding.
- `combine`: per token, the sum of its k expert outputs gathered from the expert-sorted layout.
- `route_topk`: MoE routing, float32 softmax over router logits and the top-k experts, in one pass.

Contract: inputs are contiguous; CUDA tensors use Triton when it is importable, everything else the
reference arithmetic below. Results agree with the reference within bf16 rounding (float32 accumulation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

try:  # Triton ships with CUDA builds of torch; CPU-only installs fall back to PyTorch.
    import triton

    from engine.triton_kernels import (
        _add_rms_norm_kernel,
        _combine_kernel,
        _qk_norm_rope_kernel,
        _route_topk_kernel,
        _row_quant_fp8_kernel,
        _swiglu_fp8_kernel,
        _swiglu_kernel,
    )

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False

_BLOCK = 1024


def _use_triton(t: torch.Tensor) -> bool:
    return HAVE_TRITON and t.is_cuda


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def qk_norm_rope(
    qkv: torch.Tensor,
    qw: torch.Tensor,
    kw: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    hq: int,
    hk: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split fused QKV (T, (hq + 2 hk) d); per-head RMSNorm of q and k; rotary embedding with cos/sin (T, d).

    Returns contiguous q (T, hq, d), k (T, hk, d), v (T, hk, d).
    """
    t = qkv.shape[0]
    d = cos.shape[-1]
    if not _use_triton(qkv) or d % 2 or (d & (d - 1)):
        q, k, v = torch.split(qkv, [hq * d, hk * d, hk * d], dim=-1)
        q = rms_norm_reference(q.reshape(t, hq, d), qw, eps)  # (T, hq, d)
        k = rms_norm_reference(k.reshape(t, hk, d), kw, eps)  # (T, hk, d)
        c, s = cos[:, None, :], sin[:, None, :]  # (T, 1, d)
        q = q * c + _rotate_half(q) * s
        k = k * c + _rotate_half(k) * s
        return q, k, v.reshape(t, hk, d).contiguous()
    out = (
        torch.empty(t, hq, d, dtype=qkv.dtype, device=qkv.device),
        torch.empty(t, hk, d, dtype=qkv.dtype, device=qkv.device),
        torch.empty(t, hk, d, dtype=qkv.dtype, device=qkv.device),
    )
    if t:
        _qk_norm_rope_kernel[(t,)](
            qkv,
            qw,
            kw,
            cos.contiguous(),
            sin.contiguous(),
            *out,
            eps,
            hq=hq,
            hk=hk,
            d=d,
            heads_pad=triton.next_power_of_2(hq + 2 * hk),
            num_warps=4,
        )
    return out


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as the reference thinker computes it: float32 statistics, cast back, then scale."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, RMSNorm(x + delta)) for (T, H) tensors."""
    if not _use_triton(x):
        y = x + delta
        return y, rms_norm_reference(y, weight, eps)
    t, hidden = x.shape
    y = torch.empty_like(x)
    n = torch.empty_like(x)
    if t:
        _add_rms_norm_kernel[(t,)](
            x,
            delta.contiguous(),
            weight,
            y,
            n,
            eps,
            hidden=hidden,
            block=triton.next_power_of_2(hidden),
            num_warps=8,
        )
    return y, n


def swiglu_weighted(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up * w for (S, 2I) gate|up rows and (S,) float weights -> (S, I)."""
    if not _use_triton(h):
        gate, up = h.chunk(2, dim=-1)
        return (F.silu(gate) * up * w.unsqueeze(-1).to(h.dtype)).to(h.dtype)
    s, two_i = h.shape
    inter = two_i // 2
    out = torch.empty(s, inter, dtype=h.dtype, device=h.device)
    total = s * inter
    if total:
        _swiglu_kernel[(triton.cdiv(total, _BLOCK),)](
            h, w.contiguous(), out, total, inter=inter, block=_BLOCK, num_warps=4
        )
    return out


def combine(y: torch.Tensor, inv: torch.Tensor, k: int) -> torch.Tensor:
    """out[t] = sum_j y[inv[t k + j]] for y (S, H) in expert order, inv (T k,) -> (T, H)."""
    t = inv.numel() // k
    if not _use_triton(y):
        return y.index_select(0, inv).view(t, k, -1).float().sum(dim=1).to(y.dtype)
    hidden = y.shape[1]
    out = torch.empty(t, hidden, dtype=y.dtype, device=y.device)
    total = t * hidden
    if total:
        _combine_kernel[(triton.cdiv(total, _BLOCK),)](
            y, inv, out, total, hidden=hidden, k=k, block=_BLOCK, num_warps=4
        )
    return out


def route_topk(logits: torch.Tensor, k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts per token from router logits (T, E): float32 softmax as the reference thinker does.

    Returns weights (T, k) float32 (renormalised to sum 1 over the k when `normalize`) and expert ids
    (T, k), largest first. On CUDA the ids are int32 and a tie goes to the lowest expert id; the CPU twin
    returns `torch.topk`'s int64 ids.
    """
    if not _use_triton(logits):
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)  # (T, E)
        top_w, top_i = torch.topk(probs, k, dim=-1)  # (T, k)
        if normalize:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        return top_w, top_i
    t, e = logits.shape
    top_w = torch.empty(t, k, dtype=torch.float32, device=logits.device)
    top_i = torch.empty(t, k, dtype=torch.int32, device=logits.device)
    if t:
        rows = 16
        _route_topk_kernel[(triton.cdiv(t, rows),)](
            logits.contiguous(),
            top_w,
            top_i,
            t,
            e=e,
            e_pad=triton.next_power_of_2(e),
            k=k,
            k_pad=triton.next_power_of_2(k),
            normalize=normalize,
            block_rows=rows,
            num_warps=4,
        )
    return top_w, top_i


def row_quant_fp8(x: torch.Tensor, fp8: torch.dtype, fp8_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton per-row e4m3 quantisation of a CUDA (R, K) tensor: (R, K) `fp8`, (R,) float32 scales.
    `engine.fp8.quantize_rows` is the public entry with the CPU twin."""
    r, n = x.shape
    q = torch.empty(r, n, dtype=fp8, device=x.device)
    s = torch.empty(r, dtype=torch.float32, device=x.device)
    if r:
        _row_quant_fp8_kernel[(r,)](
            x.contiguous(), q, s, n=n, block=triton.next_power_of_2(n), fp8_max=fp8_max, num_warps=4
        )
    return q, s


def swiglu_fp8(
    h: torch.Tensor, w: torch.Tensor, fp8: torch.dtype, fp8_max: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton silu(gate) * up * w with per-row e4m3 quantisation of the result (see `engine.fp8`)."""
    s_rows, two_i = h.shape
    inter = two_i // 2
    q = torch.empty(s_rows, inter, dtype=fp8, device=h.device)
    s = torch.empty(s_rows, dtype=torch.float32, device=h.device)
    if s_rows:
        _swiglu_fp8_kernel[(s_rows,)](
            h,
            w.contiguous(),
            q,
            s,
            inter=inter,
            block=triton.next_power_of_2(inter),
            fp8_max=fp8_max,
            num_warps=4,
        )
    return q, s
