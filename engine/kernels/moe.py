"""The MoE experts of one layer after routing, fused for the GPU fast path (Triton), with a PyTorch twin.

The unfused path (`fastpath`, CUTLASS grouped GEMMs) runs, between the router and the residual, the token
gather into expert order, the gate/up GEMM, SwiGLU (after a gather of the routing weights), the down GEMM,
and the per-token sum read through the inverse permutation. Here there are two kernels, and two
intermediate tensors never exist:

    order (S,) pairs sorted by expert, counts (E,)            [S = T * k token-expert pairs;
                                                              `elementwise.group_by_expert`]
    gate_up: x[order // k] (gathered in the A load) . W_gate|up[e]  -> silu(g) * u * routing weight
             (S, I) in expert order                              [(S, 2I) never written]
    down:    (S, I) . W_down[e] -> (S, H) written in pair order (token * k + j)   [no inverse index]

`experts_pairs` returns those (S, H) pair-order rows: the fast path sums each token's k rows inside its
residual add and RMSNorm (`elementwise.add_pairs_rms_norm`). `experts_forward` adds the per-token sum,
out[t] = sum_j y[t * k + j] (T, H) (`elementwise.combine`), for callers that want the block's output.

Tile shapes are picked per call from the average rows per expert: a lone request (~50 rows per expert)
is bound by reading the weights, a large batch (thousands of rows) by the tensor cores; both use the
same k step, so a record's result does not depend on the tile shape chosen for its batch beyond
accumulation order inside a tensor-core step. Shapes and their measured speed: BENCHMARKS.md.

Contract: `experts_pairs` and `experts_forward` take contiguous CUDA tensors in the activation dtype for
the Triton path (`experts_pairs_triton`, for expert sizes `supported` accepts; it also runs under
Triton's interpreter on CPU, for tests); anything else (CPU tests) runs `experts_pairs_reference`, the
same arithmetic in plain PyTorch, which syncs and so cannot be captured in a CUDA graph. `counts` must
be the per-expert histogram of the pairs' expert ids and `order` the pair ids sorted by expert (stably
or not).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812

from engine.kernels import elementwise

try:  # Triton ships with CUDA builds of torch; CPU-only installs fall back to PyTorch.
    import triton
    from triton.tools.tensor_descriptor import TensorDescriptor

    from engine.kernels.moe_triton import (
        _moe_down_kernel,
        _moe_down_tma_kernel,
        _moe_gate_up_kernel,
        _moe_gate_up_tma_kernel,
    )

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False


@dataclass(frozen=True, slots=True)
class Tiles:
    """One kernel's launch shape: rows, output columns and reduction step per program, warps, stages."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    tma: bool = False
    """Weights (and the down projection's activations) through TMA descriptors instead of pointer loads."""
    ws: bool = False
    """Triton's automatic warp specialisation of the k-loop (with `tma` only)."""


@dataclass(frozen=True, slots=True)
class MoeTiles:
    """Launch shapes of the two expert kernels for one regime."""

    gate_up: Tiles
    down: Tiles


SMALL = MoeTiles(gate_up=Tiles(64, 64, 64, 4, 4), down=Tiles(64, 128, 64, 4, 4))
"""Few rows per expert (a lone request): weight-read bound. One full-size layer, 800 tokens, uniform
routing, graph replays on the H200 (`bench.moe_kernels`): 319.9 us (3.78 TB/s of weights) against
442.0 us unfused; TMA loads made no difference here (317.9 us)."""
LARGE = MoeTiles(gate_up=Tiles(128, 128, 64, 8, 4, tma=True), down=Tiles(128, 256, 64, 8, 3, tma=True))
"""Many rows per expert (large batches): tensor-core bound, weights (and the down projection's rows)
through TMA. Same bench: 9,788.3 us at 65,536 tokens against 10,293.2 us unfused and 10,455.0 us for the same
shapes with pointer loads; the sweep's best at 4,096 tokens (767.9 us against 831.9 unfused) differs only in
the down kernel's stage count (4)."""
LARGE_FROM_ROWS_PER_EXPERT = 192
"""Average rows per expert from which `LARGE` is used."""


def tiles_for(pairs: int, experts: int) -> MoeTiles:
    """The regime of a call with `pairs` token-expert pairs over `experts` experts."""
    return LARGE if pairs >= LARGE_FROM_ROWS_PER_EXPERT * experts else SMALL


def _fit(block: int, dim: int) -> int:
    # The largest power-of-two step <= `block` dividing `dim` (tensor-core steps need >= 16), else 0.
    while block > 16 and dim % block:
        block //= 2
    return block if block >= 16 and dim % block == 0 else 0


def supported(hidden: int, inter: int) -> bool:
    """Whether the Triton kernels take these expert sizes (multiples of 16: the release and the tiny one)."""
    return HAVE_TRITON and _fit(16, hidden) > 0 and _fit(16, inter) > 0


def _row_tiles(pairs: int, experts: int, block_m: int) -> int:
    # Upper bound of sum_e ceil(counts[e] / block_m) over every split of `pairs` rows into `experts`.
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
    `counts` (E,) pairs per expert (both as `elementwise.group_by_expert` returns them); `top_w` (T, k)
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
    gu_n, gu_k = _fit(gu.block_n, inter), _fit(gu.block_k, hidden)
    grid = (_row_tiles(pairs, experts, gu.block_m) * (inter // gu_n),)
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
    dn_n, dn_k = _fit(dn.block_n, hidden), _fit(dn.block_k, inter)
    grid = (_row_tiles(pairs, experts, dn.block_m) * (hidden // dn_n),)
    dn_tiles = {"block_m": dn.block_m, "block_n": dn_n, "block_k": dn_k, "num_warps": dn.warps}
    if dn.tma:
        a_dn: object = TensorDescriptor.from_tensor(act, [dn.block_m, dn_k])
        w_dn: object = TensorDescriptor.from_tensor(down_proj, [1, dn_n, dn_k])
        dn_kernel, dn_pipe = _moe_down_tma_kernel, {"stages": dn.stages, "ws": dn.ws}
    else:
        a_dn, w_dn, dn_kernel, dn_pipe = act, down_proj, _moe_down_kernel, {"num_stages": dn.stages}
    dn_kernel[grid](a_dn, w_dn, order, counts, y, **shapes, **dn_tiles, **dn_pipe)
    return y
