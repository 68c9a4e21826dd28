"""Fused elementwise kernels for the GPU fast path (Triton), each with a plain-PyTorch twin for CPU.

Profiling the packed decoder on the H200 (64 x 512 tokens) showed the memory-bound glue between the
GEMMs taking more time than the expert GEMMs themselves. Each kernel here makes one coalesced pass:

- `group_by_expert`: MoE pairs grouped by expert (a stable counting sort of the (T, k) expert ids):
  order (T k,), counts (E,); `group_by_expert_inverse` gives the grouped GEMMs' cumulative counts and
  each pair's sorted slot instead of the counts.
- `add_pairs_rms_norm`: residual add of each token's k expert outputs (summed in float32, read in pair
  order or through the inverse index) and RMSNorm of the sum, -> (T, H), (T, H). `add_rms_norm` (one
  (T, H) delta) and `combine` (the per-token sum alone) are the same kernel.
- `swiglu_weighted`: silu(gate) * up * routing weight, (S, 2I) -> (S, I).
- `qk_norm_rope`: split fused QKV, per-head RMSNorm of q and k, rotary embedding.
- `route_topk`: MoE routing, float32 softmax over router logits and the top-k experts, in one pass.

Contract: inputs are contiguous; CUDA tensors use Triton when it is importable (CPU tensors too under
Triton's interpreter, `TRITON_INTERPRET=1`, for tests), everything else the reference arithmetic below.
Results agree with the reference within bf16 rounding (float32 accumulation); the grouping matches it
exactly. Every Triton launch has a grid fixed by the shapes and no host sync, so a CUDA graph can
capture it.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F  # noqa: N812

try:  # Triton ships with CUDA builds of torch; CPU-only installs fall back to PyTorch.
    import triton

    from engine.kernels.elementwise_triton import (
        _group_by_expert_kernel,
        _qk_norm_rope_kernel,
        _route_topk_kernel,
        _row_quant_fp8_kernel,
        _sum_rows_kernel,
        _swiglu_fp8_kernel,
        _swiglu_kernel,
    )

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False

_BLOCK = 1024
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""Triton's CPU interpreter is on (tests): the kernels run on CPU tensors too."""

GROUP_BLOCK = 4096
"""Expert ids per step of `group_by_expert`'s scans (one request's ~6,400 pairs: two steps)."""
COUNTING_SORT_MAX_PAIRS = 32_768
"""Pairs up to which `group_by_expert` runs its counting sort; above, torch's radix sort and histc. Each
of the E programs scans all S ids, so its cost grows with S (`bench.moe_glue`, H200, E = 128):
7.3 against 23.2 us at 6,456 pairs (one 807-token request), 18.9 against 22.9 at 32,768, 71.3 against
26.4 at 131,072 and 274.2 against 35.9 at 524,288."""


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
    return _sum_rows(delta.contiguous(), None, 1, (x, weight, eps))


def add_pairs_rms_norm(
    x: torch.Tensor,
    rows: torch.Tensor,
    inv: torch.Tensor | None,
    k: int,
    weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + d, RMSNorm(x + d)) with d (T, H) each token's sum of its k expert outputs (`combine`).

    `x` (T, H) the residual; `rows` the expert outputs, (T k, H) in pair order (token * k + j) when
    `inv` is None, else (S, H) in expert order with `inv` (T k,) the slot of each pair. d is summed in
    float32 in j order and rounded to `rows`' dtype before the add: the same numbers as `combine`
    followed by `add_rms_norm`, in one pass over the rows instead of two kernels.
    """
    if not _use_triton(x):
        y = x + sum_pairs_reference(rows, inv, k)
        return y, rms_norm_reference(y, weight, eps)
    return _sum_rows(rows, inv, k, (x, weight, eps))


def combine(y: torch.Tensor, inv: torch.Tensor | None, k: int) -> torch.Tensor:
    """out[t] = sum_j y[inv[t k + j]] for y (S, H) in expert order and inv (T k,), or sum_j y[t k + j]
    for y (T k, H) in pair order when `inv` is None -> (T, H) (float32 sums, in j order)."""
    if not _use_triton(y):
        return sum_pairs_reference(y, inv, k)
    out, _ = _sum_rows(y, inv, k, None)
    return out


def sum_pairs_reference(y: torch.Tensor, inv: torch.Tensor | None, k: int) -> torch.Tensor:
    """PyTorch twin of `combine` (and of the sum inside `add_pairs_rms_norm`): (T, H)."""
    pairs = y if inv is None else y.index_select(0, inv)  # (T k, H) pair order
    return pairs.view(pairs.shape[0] // k, k, y.shape[1]).float().sum(dim=1).to(y.dtype)


def _sum_rows(
    rows: torch.Tensor,
    inv: torch.Tensor | None,
    k: int,
    residual: tuple[torch.Tensor, torch.Tensor, float] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # One launch of `_sum_rows_kernel`: (y, normed) with a (x, weight, eps) residual, else (sum, sum).
    hidden = rows.shape[1]
    t = (rows.shape[0] if inv is None else inv.numel()) // k
    x, weight, eps = residual if residual is not None else (rows, rows, 0.0)
    y = torch.empty(t, hidden, dtype=x.dtype, device=rows.device)
    n = torch.empty_like(y) if residual is not None else y
    if t:
        _sum_rows_kernel[(t,)](
            rows,
            rows if inv is None else inv,
            x,
            weight,
            y,
            n,
            eps,
            hidden=hidden,
            k=k,
            block=triton.next_power_of_2(hidden),
            indexed=inv is not None,
            residual=residual is not None,
            num_warps=8,
        )
    return y, n


def group_by_expert(
    top_i: torch.Tensor, num_experts: int, *, block: int = GROUP_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token-expert pairs of `top_i` (T, k) expert ids grouped by expert, for the MoE kernels.

    Returns `order` (T k,) int32, the pair ids (token * k + j) sorted by expert, ascending within an
    expert (a stable sort: `torch.argsort(stable=True)`), and `counts` (E,) int32, the pairs per expert
    (`torch.bincount`). Up to `COUNTING_SORT_MAX_PAIRS` pairs one Triton launch of grid (E,), above it
    torch's radix sort and histc; no host sync either way (CUDA-graph capturable). The CPU twin takes
    `torch.topk`'s int64 ids. `block` is the ids per scan step (benchmarks, tests).
    """
    order, counts, _, _ = _group(top_i, num_experts, False, block)
    return order, counts


def group_by_expert_inverse(
    top_i: torch.Tensor, num_experts: int, *, block: int = GROUP_BLOCK
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`group_by_expert` for the grouped GEMMs: `order` (T k,) int32, `ends` (E,) int32 cumulative pair
    counts (`grouped_mm`'s offs) and `inv` (T k,) int32, the slot of each pair in `order`
    (order[inv[p]] == p), from the same launch."""
    order, _, ends, inv = _group(top_i, num_experts, True, block)
    assert inv is not None
    return order, ends, inv


def _group(
    top_i: torch.Tensor, num_experts: int, inverse: bool, block: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    # (order, counts, ends, inv or None) of the flattened ids; without `inverse`, `ends` is unspecified
    # (the caller drops it).
    flat = top_i.reshape(-1)  # (S,) pair p = token * k + j
    s = flat.numel()
    if not _use_triton(flat) or s > COUNTING_SORT_MAX_PAIRS:
        # Radix sort (stable) of 1-byte keys: one pass instead of eight for int64 expert ids.
        keys = flat.to(torch.uint8) if num_experts <= 256 else flat.to(torch.int32)
        order = torch.argsort(keys, stable=True).to(torch.int32)  # (S,)
        if flat.is_cuda:  # histc, not bincount: static shapes, no host sync (CUDA graphs)
            counts = torch.histc(flat.int(), bins=num_experts, min=0, max=num_experts - 1).int()  # (E,)
        else:
            counts = torch.bincount(flat.long(), minlength=num_experts).to(torch.int32)  # (E,)
        if not inverse:  # `group_by_expert` drops `ends`: no cumsum kernel for it
            return order, counts, counts, None
        ends = torch.cumsum(counts, dim=0, dtype=torch.int32)  # (E,)
        inv = torch.empty_like(order)
        inv[order.long()] = torch.arange(s, dtype=torch.int32, device=flat.device)  # (S,)
        return order, counts, ends, inv
    order = torch.empty(s, dtype=torch.int32, device=flat.device)
    slots = torch.empty(s, dtype=torch.int32, device=flat.device) if inverse else None
    counts = torch.empty(num_experts, dtype=torch.int32, device=flat.device)
    ends = torch.empty_like(counts)
    _group_by_expert_kernel[(num_experts,)](
        flat.contiguous(),
        order,
        order if slots is None else slots,  # not written without `inverse`
        counts,
        ends,
        s,
        e=num_experts,
        block=block,
        inverse=inverse,
        num_warps=max(4, min(16, block // 512)),
    )
    return order, counts, ends, slots


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
    `engine.kernels.fp8.quantize_rows` is the public entry with the CPU twin."""
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
    """Triton silu(gate) * up * w with per-row e4m3 quantisation of the result (see `engine.kernels.fp8`)."""
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
