"""Fused elementwise ops of the GPU fast path (Triton kernels in `engine.kernels.elementwise_triton`), each
with the plain-PyTorch twin it is tested against. Each kernel makes one coalesced pass over the
memory-bound glue between the GEMMs:

- `add_pairs_rms_norm`: residual add of each token's k expert outputs (summed in float32, read in pair
  order or through the inverse index) and RMSNorm of the sum, -> (T, H), (T, H). `add_rms_norm` (one
  (T, H) delta) and `combine` (the per-token sum alone) are the same kernel.
- `swiglu_weighted`: silu(gate) * up * routing weight, (S, 2I) -> (S, I).
- `qk_norm_rope`: split fused QKV, per-head RMSNorm of q and k, rotary embedding.

Contract: inputs are contiguous; CUDA tensors use Triton when it is importable (CPU tensors too under
Triton's interpreter, `TRITON_INTERPRET=1`, for tests), everything else the reference arithmetic below.
Results agree with the reference within bf16 rounding (float32 accumulation). Every Triton launch has a
grid fixed by the shapes and no host sync, so a CUDA graph can capture it.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F  # noqa: N812

try:  # Triton ships with CUDA builds of torch; CPU-only installs fall back to PyTorch.
    import triton

    from engine.kernels.elementwise_triton import (
        _qk_norm_rope_kernel,
        _sum_rows_kernel,
        _swiglu_kernel,
    )

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False

from engine.kernels.fp8 import FP8, FP8_MAX, Quantized, quantize_rows

_BLOCK = 1024
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""Triton's CPU interpreter is on (tests): the kernels run on CPU tensors too."""


def _use_triton(t: torch.Tensor) -> bool:
    return HAVE_TRITON and (t.is_cuda or _INTERPRETED)


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
    y, n, _ = _sum_rows(delta.contiguous(), None, 1, (x, weight, eps))
    return y, n


def add_rms_norm_fp8(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, Quantized]:
    """`add_rms_norm` and the normalised rows quantised to e4m3 with one scale per row, the same bits as
    `fp8.quantize_rows` of them, in the same pass: (x + delta, n, ((T, H) e4m3, (T,) scales))."""
    y, n, q = add_pairs_rms_norm_fp8(x, delta.contiguous(), None, 1, weight, eps)  # a sum of one per token
    assert n is not None
    return y, n, q


def add_pairs_rms_norm(
    x: torch.Tensor,
    rows: torch.Tensor,
    inv: torch.Tensor | None,
    k: int,
    weight: torch.Tensor,
    eps: float,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + d, RMSNorm(x + d)) with d (T, H) each token's sum of its k expert outputs (`combine`).

    `x` (T, H) the residual; `rows` the expert outputs, (T k, H) in pair order (token * k + j) when
    `inv` is None, else (S, H) in expert order with `inv` (T k,) the slot of each pair. d is summed in
    float32 in j order and rounded to `rows`' dtype before the add: the same numbers as `combine`
    followed by `add_rms_norm`, in one pass over the rows instead of two kernels. `valid` (pair order
    only), a (1,) int32 tensor on x's device: the tokens from `valid[0]` on are padding that no expert
    ran (`moe.route_topk`): their d is 0 and their rows are not read; the other tokens keep their bits.
    """
    if not _use_triton(x):
        y = x + _masked(sum_pairs_reference(rows, inv, k), inv, valid)
        return y, rms_norm_reference(y, weight, eps)
    y, n, _ = _sum_rows(rows, inv, k, (x, weight, eps), valid=valid)
    return y, n


def add_pairs_rms_norm_fp8(
    x: torch.Tensor,
    rows: torch.Tensor,
    inv: torch.Tensor | None,
    k: int,
    weight: torch.Tensor,
    eps: float,
    *,
    keep_normed: bool = True,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, Quantized]:
    """`add_pairs_rms_norm` and the normalised rows quantised as `add_rms_norm_fp8` does them. Without
    `keep_normed` the bf16 normalised rows are not stored and None comes in their place (a consumer that
    reads the e4m3 rows only, the next layer's FP8 QKV projection: one (T, H) store fewer); the other
    outputs keep their bits. `valid` as there."""
    if not _use_triton(x):
        y, n = add_pairs_rms_norm(x, rows, inv, k, weight, eps, valid)
        return y, (n if keep_normed else None), quantize_rows(n)
    y, n, q = _sum_rows(rows, inv, k, (x, weight, eps), quant=True, keep_normed=keep_normed, valid=valid)
    assert q is not None
    return y, (n if keep_normed else None), q


def combine(y: torch.Tensor, inv: torch.Tensor | None, k: int) -> torch.Tensor:
    """out[t] = sum_j y[inv[t k + j]] for y (S, H) in expert order and inv (T k,), or sum_j y[t k + j]
    for y (T k, H) in pair order when `inv` is None -> (T, H) (float32 sums, in j order)."""
    if not _use_triton(y):
        return sum_pairs_reference(y, inv, k)
    out, _, _ = _sum_rows(y, inv, k, None)
    return out


def padding_rows(rows: int, valid: torch.Tensor) -> torch.Tensor:
    """(rows, 1) bool on `valid`'s device, True from row valid[0] on: a graph bucket's padding
    (`PackedInputs.valid`), for the PyTorch twins that mask it."""
    return torch.arange(rows, device=valid.device)[:, None] >= valid


def _masked(d: torch.Tensor, inv: torch.Tensor | None, valid: torch.Tensor | None) -> torch.Tensor:
    # d (T, H) with the rows from valid[0] on zeroed (the twins' padding, as `_sum_rows_kernel` masks it)
    if valid is None:
        return d
    assert inv is None, "padding is masked in pair order only"
    return d.masked_fill(padding_rows(d.shape[0], valid), 0.0)


def sum_pairs_reference(y: torch.Tensor, inv: torch.Tensor | None, k: int) -> torch.Tensor:
    """PyTorch twin of `combine` (and of the sum inside `add_pairs_rms_norm`): (T, H)."""
    pairs = y if inv is None else y.index_select(0, inv)  # (T k, H) pair order
    return pairs.view(pairs.shape[0] // k, k, y.shape[1]).float().sum(dim=1).to(y.dtype)


def _sum_rows(
    rows: torch.Tensor,
    inv: torch.Tensor | None,
    k: int,
    residual: tuple[torch.Tensor, torch.Tensor, float] | None,
    quant: bool = False,
    keep_normed: bool = True,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, Quantized | None]:
    # One launch of `_sum_rows_kernel`: (y, normed, None) with a (x, weight, eps) residual, else (sum,
    # sum, None); with `quant` (a residual too) the third is normed in e4m3 and its row scales. Without
    # `keep_normed` (with `quant`: the e4m3 rows are then the only normed output) the normed rows are not
    # stored and the second is y. `valid` (pair order only): the padding tokens' sums are 0.
    assert valid is None or inv is None, "padding is masked in pair order only"
    hidden = rows.shape[1]
    t = (rows.shape[0] if inv is None else inv.numel()) // k
    x, weight, eps = residual if residual is not None else (rows, rows, 0.0)
    y = torch.empty(t, hidden, dtype=x.dtype, device=rows.device)
    assert keep_normed or quant, "without the bf16 normed rows a norm keeps its e4m3 ones"
    store_normed = residual is not None and keep_normed
    n = torch.empty_like(y) if store_normed else y
    q = torch.empty(t, hidden, dtype=FP8, device=rows.device) if quant else y
    qs = torch.empty(t, dtype=torch.float32, device=rows.device) if quant else y
    if t:
        _sum_rows_kernel[(t,)](
            rows,
            rows if inv is None else inv,
            x,
            weight,
            y,
            n,
            q,
            qs,
            y if valid is None else valid,  # not read without `masked`
            eps,
            hidden=hidden,
            k=k,
            block=triton.next_power_of_2(hidden),
            indexed=inv is not None,
            residual=residual is not None,
            quant=quant and residual is not None,
            store_normed=store_normed,
            masked=valid is not None,
            fp8_max=FP8_MAX,
            num_warps=8,
        )
    return y, n, ((q, qs) if quant else None)


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
