"""The MoE block of one layer for the GPU fast path (Triton kernels in `engine.kernels.moe_triton`), each op
with the plain-PyTorch twin it is tested against:

    route_topk:       router logits (T, E) -> float32 weights (T, k), expert ids (T, k)
    group_by_expert:  ids (T, k) -> order (S,) pairs sorted by expert, counts (E,)   [S = T * k pairs]
    experts_pairs:    gate_up: x[order // k] (gathered in the A load) . W_gate|up[e] -> silu(g) * u * weight
                               (S, I) in expert order                          [(S, 2I) never written]
                      down:    (S, I) . W_down[e] -> (S, H) in pair order (token * k + j) [no inverse index]

`experts_pairs` returns those (S, H) pair-order rows: the fast path sums each token's k rows inside its
residual add and RMSNorm (`elementwise.add_pairs_rms_norm`). `experts_forward` adds the per-token sum,
out[t] = sum_j y[t * k + j] (T, H) (`elementwise.combine`), for callers that want the block's output.

The expert kernels' tile shapes (`SMALL`, `LARGE`, data in `engine.kernels.tiles`) are picked per call
from the average rows per expert: a lone request is bound by reading the weights, a large batch by the
tensor cores; both use the same k step, so a record's result does not depend on the tile shape chosen
for its batch beyond accumulation order inside a tensor-core step.

Contract: the Triton path takes contiguous CUDA tensors in the activation dtype (`experts_pairs_triton`
for expert sizes `supported` accepts; the routing and grouping kernels for any size; all of them also
run under Triton's interpreter on CPU, `TRITON_INTERPRET=1`, for tests). Anything else runs the twins,
which sync and so cannot be captured in a CUDA graph. Every Triton launch has a grid fixed by the shapes
and no host sync. `counts` must be the per-expert histogram of the pairs' expert ids and `order` the
pair ids sorted by expert (stably or not).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F  # noqa: N812

from engine.kernels import elementwise
from engine.kernels.tiles import MoeTiles, shipped

try:  # Triton ships with CUDA builds of torch; CPU-only installs fall back to PyTorch.
    import triton
    from triton.tools.tensor_descriptor import TensorDescriptor

    from engine.kernels.moe_triton import (
        _group_by_expert_kernel,
        _moe_down_kernel,
        _moe_down_tma_kernel,
        _moe_gate_up_kernel,
        _moe_gate_up_tma_kernel,
        _route_topk_kernel,
    )

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""Triton's CPU interpreter is on (tests): the routing and grouping kernels run on CPU tensors too."""

SMALL = shipped().moe_small
"""Expert kernel shapes for few rows per expert (a lone request): weight-read bound."""
LARGE = shipped().moe_large
"""Expert kernel shapes for many rows per expert (large batches): tensor-core bound."""
LARGE_FROM_ROWS_PER_EXPERT = shipped().moe_large_from_rows_per_expert
"""Average rows per expert from which `LARGE` is used."""

GROUP_BLOCK = 4096
"""Expert ids per step of `group_by_expert`'s scans (one request's ~6,400 pairs: two steps)."""
COUNTING_SORT_MAX_PAIRS = 32_768
"""Pairs up to which `group_by_expert` runs its counting sort; above, torch's radix sort and histc. Each
of the E programs scans all S ids, so its cost grows with S (chosen by `bench.moe_glue`; BENCHMARKS.md,
"Engine, round four", "MoE glue")."""


def _use_triton(t: torch.Tensor) -> bool:
    return HAVE_TRITON and (t.is_cuda or _INTERPRETED)


def route_topk(
    logits: torch.Tensor, k: int, normalize: bool, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts per token from router logits (T, E): float32 softmax as the reference thinker does.

    Returns weights (T, k) float32 (renormalised to sum 1 over the k when `normalize`) and expert ids
    (T, k), largest first. On CUDA the ids are int32 and a tie goes to the lowest expert id; the CPU twin
    returns `torch.topk`'s int64 ids. `valid`, a (1,) int32 tensor on the logits' device, marks the rows
    from `valid[0]` on as padding (a CUDA graph's bucket tail): their ids are E, past every expert, which
    `group_by_expert` leaves out, and their weights 0; the other rows keep their bits.
    """
    if not _use_triton(logits):
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)  # (T, E)
        top_w, top_i = torch.topk(probs, k, dim=-1)  # (T, k)
        if normalize:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        if valid is not None:
            pad = elementwise.padding_rows(logits.shape[0], valid)  # (T, 1)
            top_w = top_w.masked_fill(pad, 0.0)
            top_i = top_i.masked_fill(pad, logits.shape[1])
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
            top_i if valid is None else valid,  # not read without `masked`
            t,
            e=e,
            e_pad=triton.next_power_of_2(e),
            k=k,
            k_pad=triton.next_power_of_2(k),
            normalize=normalize,
            masked=valid is not None,
            block_rows=rows,
            num_warps=4,
        )
    return top_w, top_i


def group_by_expert(
    top_i: torch.Tensor, num_experts: int, *, block: int = GROUP_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token-expert pairs of `top_i` (T, k) expert ids grouped by expert, for the MoE kernels.

    Returns `order` (T k,) int32, the pair ids (token * k + j) sorted by expert, ascending within an
    expert (a stable sort: `torch.argsort(stable=True)`), and `counts` (E,) int32, the pairs per expert
    (`torch.bincount`). Up to `COUNTING_SORT_MAX_PAIRS` pairs one Triton launch of grid (E,), above it
    torch's radix sort and histc; no host sync either way (CUDA-graph capturable). The CPU twin takes
    `torch.topk`'s int64 ids. `block` is the ids per scan step (benchmarks, tests). Ids equal to E
    (`route_topk`'s padding) are counted nowhere: `order` past `counts.sum()` is unspecified.
    """
    order, counts, _, _ = _group(top_i, num_experts, False, block)
    return order, counts


def group_by_expert_inverse(
    top_i: torch.Tensor, num_experts: int, *, block: int = GROUP_BLOCK
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`group_by_expert` for the grouped GEMMs: `order` (T k,) int32, `ends` (E,) int32 cumulative pair
    counts (`grouped_mm`'s offs) and `inv` (T k,) int32, the slot of each pair in `order`
    (order[inv[p]] == p), from the same launch. Every id must name an expert (no padding: `inv` of a
    padding pair would be unspecified)."""
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
        # Radix sort (stable) of 1-byte keys: one pass instead of eight for int64 expert ids (padding's E
        # must fit them too: it sorts last).
        keys = flat.to(torch.uint8) if num_experts < 256 else flat.to(torch.int32)
        order = torch.argsort(keys, stable=True).to(torch.int32)  # (S,)
        if flat.is_cuda:  # histc, not bincount: static shapes, no host sync (CUDA graphs)
            counts = torch.histc(flat.int(), bins=num_experts, min=0, max=num_experts - 1).int()  # (E,)
        else:
            counts = torch.bincount(flat.long(), minlength=num_experts)[:num_experts].to(torch.int32)  # (E,)
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


def tiles_for(pairs: int, experts: int) -> MoeTiles:
    """The regime of a call with `pairs` token-expert pairs over `experts` experts."""
    return LARGE if pairs >= LARGE_FROM_ROWS_PER_EXPERT * experts else SMALL


def fit_block(block: int, dim: int) -> int:
    """The largest power-of-two step <= `block` dividing `dim` (tensor-core steps need >= 16), else 0."""
    while block > 16 and dim % block:
        block //= 2
    return block if block >= 16 and dim % block == 0 else 0


def supported(hidden: int, inter: int) -> bool:
    """Whether the Triton kernels take these expert sizes (multiples of 16: the release and the tiny one)."""
    return HAVE_TRITON and fit_block(16, hidden) > 0 and fit_block(16, inter) > 0


def row_tiles(pairs: int, experts: int, block_m: int) -> int:
    """Upper bound of sum_e ceil(counts[e] / block_m) over every split of `pairs` rows into `experts`."""
    return (pairs + experts * (block_m - 1)) // block_m


def experts_pairs_reference(
    x: torch.Tensor,
    order: torch.Tensor,
    counts: torch.Tensor,
    top_w: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    """PyTorch twin of `experts_pairs`, one expert at a time (CPU, tests): (T k, H) in pair order."""
    t, hidden = x.shape
    k = top_w.shape[1]
    inter = down_proj.shape[2]
    y = torch.zeros(t * k, hidden, dtype=x.dtype, device=x.device)  # pair order
    flat_w = top_w.reshape(-1)
    start = 0
    for expert, n in enumerate(counts.tolist()):
        n = int(n)
        if not n:
            continue
        pairs = order[start : start + n].long()
        start += n
        h = F.linear(x.index_select(0, pairs // k), gate_up_proj[expert])  # (n, 2I), rounded as the GEMM
        g, u = h[:, :inter].float(), h[:, inter:].float()
        act = (F.silu(g) * u * flat_w.index_select(0, pairs).float()[:, None]).to(x.dtype)  # (n, I)
        y[pairs] = F.linear(act, down_proj[expert])  # (n, H)
    return y


def experts_pairs(
    x: torch.Tensor,
    order: torch.Tensor,
    counts: torch.Tensor,
    top_w: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    tiles: MoeTiles | None = None,
) -> torch.Tensor:
    """weight * down(silu(gate(x)) * up(x)) for every token-expert pair: (T k, H) in pair order
    (token * k + j), not yet summed over a token's k experts (`elementwise.add_pairs_rms_norm` does that).

    `x` (T, H) normalised hidden states; `order` (T k,) pair ids (token * k + j) sorted by expert;
    `counts` (E,) pairs per expert (both as `group_by_expert` returns them); `top_w` (T, k)
    float32 routing weights; `gate_up_proj` (E, 2I, H) and `down_proj` (E, H, I) as transformers stores
    them. `tiles` overrides the regime (benchmarks).
    """
    if not (x.is_cuda and supported(x.shape[1], down_proj.shape[2])):
        return experts_pairs_reference(x, order, counts, top_w, gate_up_proj, down_proj)
    return experts_pairs_triton(x, order, counts, top_w, gate_up_proj, down_proj, tiles)


def experts_forward(
    x: torch.Tensor,
    order: torch.Tensor,
    counts: torch.Tensor,
    top_w: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    tiles: MoeTiles | None = None,
) -> torch.Tensor:
    """Sum over each token's k experts of `experts_pairs`: (T, H) (arguments as `experts_pairs`)."""
    y = experts_pairs(x, order, counts, top_w, gate_up_proj, down_proj, tiles)  # (T k, H)
    return elementwise.combine(y, None, top_w.shape[1])


def experts_pairs_triton(
    x: torch.Tensor,
    order: torch.Tensor,
    counts: torch.Tensor,
    top_w: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    tiles: MoeTiles | None = None,
) -> torch.Tensor:
    """`experts_pairs` through the Triton kernels on `x`'s device (CUDA, or CPU under Triton's
    interpreter, `TRITON_INTERPRET=1`, for tests): (T k, H)."""
    t, hidden = x.shape
    k = top_w.shape[1]
    experts, two_inter, _ = gate_up_proj.shape
    inter = two_inter // 2
    pairs = t * k
    tl_ = tiles or tiles_for(pairs, experts)
    act = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)  # expert order
    y = torch.empty(pairs, hidden, dtype=x.dtype, device=x.device)  # pair order
    if not t:
        return y
    e_pad = triton.next_power_of_2(experts)
    gu = tl_.gate_up
    gu_n, gu_k = fit_block(gu.block_n, inter), fit_block(gu.block_k, hidden)
    grid = (row_tiles(pairs, experts, gu.block_m) * (inter // gu_n),)
    shapes = {"hidden": hidden, "inter": inter, "e": experts, "e_pad": e_pad}
    # The TMA kernels take weight (and row) descriptors and pipeline their own k-loop (`stages`, `ws`);
    # the pointer kernels take the tensors and Triton's launch-level `num_stages`.
    gu_tiles = {"block_m": gu.block_m, "block_n": gu_n, "block_k": gu_k, "num_warps": gu.warps}
    if gu.tma:
        w_gu = TensorDescriptor.from_tensor(gate_up_proj, [1, gu_n, gu_k])
        gu_kernel, gu_pipe = _moe_gate_up_tma_kernel, {"stages": gu.stages, "ws": gu.ws}
    else:
        w_gu, gu_kernel, gu_pipe = gate_up_proj, _moe_gate_up_kernel, {"num_stages": gu.stages}
    gu_kernel[grid](x, w_gu, order, counts, top_w, act, **shapes, top_k=k, **gu_tiles, **gu_pipe)
    dn = tl_.down
    dn_n, dn_k = fit_block(dn.block_n, hidden), fit_block(dn.block_k, inter)
    grid = (row_tiles(pairs, experts, dn.block_m) * (hidden // dn_n),)
    dn_tiles = {"block_m": dn.block_m, "block_n": dn_n, "block_k": dn_k, "num_warps": dn.warps}
    if dn.tma:
        a_dn: object = TensorDescriptor.from_tensor(act, [dn.block_m, dn_k])
        w_dn: object = TensorDescriptor.from_tensor(down_proj, [1, dn_n, dn_k])
        dn_kernel, dn_pipe = _moe_down_tma_kernel, {"stages": dn.stages, "ws": dn.ws}
    else:
        a_dn, w_dn, dn_kernel, dn_pipe = act, down_proj, _moe_down_kernel, {"num_stages": dn.stages}
    dn_kernel[grid](a_dn, w_dn, order, counts, y, **shapes, **dn_tiles, **dn_pipe)
    return y
