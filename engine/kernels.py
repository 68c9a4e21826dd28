"""Fused elementwise kernels for the GPU fast path (Triton), each with a plain-PyTorch twin for CPU.

Profiling the packed decoder on the H200 (64 x 512 tokens) showed the memory-bound glue between the
GEMMs taking more time than the expert GEMMs themselves. Each kernel here makes one coalesced pass:

- `add_rms_norm`: residual add and RMSNorm of the sum, (T, H) -> (T, H), (T, H).
- `swiglu_weighted`: silu(gate) * up * routing weight, (S, 2I) -> (S, I).
- `qk_norm_rope`: split fused QKV, per-head RMSNorm of q and k, rotary embedding.
- `combine`: per token, the sum of its k expert outputs gathered from the expert-sorted layout.

Contract: inputs are contiguous; CUDA tensors use Triton when it is importable, everything else the
reference arithmetic below. Results agree with the reference within bf16 rounding (float32 accumulation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

try:  # Triton ships with CUDA builds of torch; CPU-only installs fall back to PyTorch.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False

_BLOCK = 1024


def _use_triton(t: torch.Tensor) -> bool:
    return HAVE_TRITON and t.is_cuda


# Triton kernels take no Python annotations on their arguments (the JIT resolves them), hence the ignores.
if HAVE_TRITON:

    @triton.jit  # type: ignore[untyped-decorator]
    def _add_rms_norm_kernel(
        x_ptr,
        d_ptr,
        w_ptr,
        y_ptr,
        n_ptr,
        eps,
        hidden: tl.constexpr,  # type: ignore[no-untyped-def]
        block: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, block)
        mask = cols < hidden
        base = row * hidden
        x = tl.load(x_ptr + base + cols, mask=mask, other=0.0)
        d = tl.load(d_ptr + base + cols, mask=mask, other=0.0)
        y = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
        tl.store(y_ptr + base + cols, y, mask=mask)
        yf = y.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(yf * yf, axis=0) / hidden + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        normed = (yf * rstd).to(x.dtype).to(tl.float32) * w.to(tl.float32)
        tl.store(n_ptr + base + cols, normed.to(x.dtype), mask=mask)

    @triton.jit  # type: ignore[untyped-decorator]
    def _swiglu_kernel(
        h_ptr,
        w_ptr,
        out_ptr,
        total,
        inter: tl.constexpr,  # type: ignore[no-untyped-def]
        block: tl.constexpr,
    ):
        idx = tl.program_id(0).to(tl.int64) * block + tl.arange(0, block)
        mask = idx < total
        s = idx // inter
        i = idx % inter
        g = tl.load(h_ptr + s * (2 * inter) + i, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(h_ptr + s * (2 * inter) + inter + i, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + s, mask=mask, other=0.0).to(tl.float32)
        a = g / (1.0 + tl.exp(-g)) * u * w
        tl.store(out_ptr + idx, a.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit  # type: ignore[untyped-decorator]
    def _combine_kernel(
        y_ptr,
        inv_ptr,
        out_ptr,
        total,
        hidden: tl.constexpr,  # type: ignore[no-untyped-def]
        k: tl.constexpr,
        block: tl.constexpr,
    ):
        idx = tl.program_id(0).to(tl.int64) * block + tl.arange(0, block)
        mask = idx < total
        t = idx // hidden
        col = idx % hidden
        acc = tl.zeros([block], dtype=tl.float32)
        for j in tl.static_range(k):
            row = tl.load(inv_ptr + t * k + j, mask=mask, other=0).to(tl.int64)
            acc += tl.load(y_ptr + row * hidden + col, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + idx, acc.to(out_ptr.dtype.element_ty), mask=mask)


if HAVE_TRITON:

    @triton.jit  # type: ignore[untyped-decorator]
    def _qk_norm_rope_kernel(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, eps,  # type: ignore[no-untyped-def]
                             hq: tl.constexpr, hk: tl.constexpr, d: tl.constexpr, heads_pad: tl.constexpr):
        # One program per token: all its q and k heads as a (heads, d/2) tile, both rotary halves at once.
        t = tl.program_id(0).to(tl.int64)
        half: tl.constexpr = d // 2
        heads = tl.arange(0, heads_pad)[:, None]  # (Hp, 1)
        cols = tl.arange(0, half)[None, :]  # (1, half)
        mask = (heads < hq + hk) & (cols < half)  # (Hp, half)
        row = qkv_ptr + t * ((hq + 2 * hk) * d) + heads * d
        x1 = tl.load(row + cols, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(row + half + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / d + eps)  # (Hp,)
        rstd2 = rstd[:, None]  # (Hp, 1)
        is_q = heads < hq  # (Hp, 1)
        w1 = tl.where(is_q, tl.load(qw_ptr + cols).to(tl.float32), tl.load(kw_ptr + cols).to(tl.float32))
        w2 = tl.where(is_q, tl.load(qw_ptr + half + cols).to(tl.float32),
                      tl.load(kw_ptr + half + cols).to(tl.float32))
        # Round the normalised values to the activation dtype before scaling, as the reference does.
        n1 = ((x1 * rstd2).to(q_ptr.dtype.element_ty).to(tl.float32) * w1).to(q_ptr.dtype.element_ty)
        n2 = ((x2 * rstd2).to(q_ptr.dtype.element_ty).to(tl.float32) * w2).to(q_ptr.dtype.element_ty)
        n1 = n1.to(tl.float32)
        n2 = n2.to(tl.float32)
        c1 = tl.load(cos_ptr + t * d + cols).to(tl.float32)  # (1, half)
        c2 = tl.load(cos_ptr + t * d + half + cols).to(tl.float32)
        s1 = tl.load(sin_ptr + t * d + cols).to(tl.float32)
        s2 = tl.load(sin_ptr + t * d + half + cols).to(tl.float32)
        o1 = (n1 * c1 - n2 * s1).to(q_ptr.dtype.element_ty)
        o2 = (n2 * c2 + n1 * s2).to(q_ptr.dtype.element_ty)
        q_mask = mask & is_q
        q_out = q_ptr + t * (hq * d) + heads * d
        tl.store(q_out + cols, o1, mask=q_mask)
        tl.store(q_out + half + cols, o2, mask=q_mask)
        k_mask = mask & (heads >= hq)
        k_out = k_ptr + t * (hk * d) + (heads - hq) * d
        tl.store(k_out + cols, o1, mask=k_mask)
        tl.store(k_out + half + cols, o2, mask=k_mask)


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
        q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
        q = rms_norm_reference(q.reshape(t, hq, d), qw, eps)  # (T, hq, d)
        k = rms_norm_reference(k.reshape(t, hk, d), kw, eps)  # (T, hk, d)
        c, s = cos[:, None, :], sin[:, None, :]  # (T, 1, d)
        q = q * c + _rotate_half(q) * s
        k = k * c + _rotate_half(k) * s
        return q, k, v.reshape(t, hk, d).contiguous()
    q = torch.empty(t, hq, d, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(t, hk, d, dtype=qkv.dtype, device=qkv.device)
    if t:
        _qk_norm_rope_kernel[(t,)](
            qkv, qw, kw, cos.contiguous(), sin.contiguous(), q, k, eps,
            hq=hq, hk=hk, d=d, heads_pad=triton.next_power_of_2(hq + hk), num_warps=4,
        )
    v = qkv[:, (hq + hk) * d :].reshape(t, hk, d).contiguous()
    return q, k, v


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
