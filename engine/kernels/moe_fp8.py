"""The FP8 expert block for the GPU fast path: two fused Triton GEMMs on e4m3 operands (kernels in
`engine.kernels.moe_fp8_triton`), with the plain-PyTorch twin they are tested against.

    x (T, H) bf16 --row quant--> (T, H) e4m3 + (T,) scale          [`engine.kernels.fp8.quantize_rows`]
    gate_up: x[order // k] (gathered in the A load) . W_gate|up[e] -> silu(g) * u * weight, quantised per
             row and per `group` columns: (S, I) e4m3 + (S, I / group) scales in expert order
    requant: each row's groups brought to one scale, the largest of them (large batches; `DOWN_SCALING`)
    down:    (S, I) . W_down[e], the tensor-core products chained, scaled per row and channel at the end
             -> (S, H) bf16 in pair order (token * k + j)

It replaces, for the same `Fp8Experts` weights, the unfused FP8 path (quantise, gather, CUTLASS scaled
grouped GEMM, SwiGLU + quantise, CUTLASS again, inverse permutation): the gather is part of the first
GEMM's load, the activations' quantisation its epilogue, and the result lands in pair order, as the bf16
kernels of `engine.kernels.moe` do. The gate/up epilogue quantises per `group` columns, because a gate/up
program sees `block_n` of a row's columns only; the down GEMM either applies those scales per k step
("group") or, by default, gets each row requantised to one scale first ("row_pass", a pass over the
e4m3 activations; "row_fused" does it in the down kernel's load) so that its products chain in the
accumulator.

Tile shapes (`SMALL`, `LARGE`, `GROUP`; data in `engine.kernels.tiles`) are picked per call and per GEMM
from the average rows per expert (`tiles_for`, `down_tiles_for`). Both regimes share the k steps and the
group, so a record's result does not depend on the regime its batch took beyond accumulation order inside
a tensor-core step.

Contract: `experts_pairs_fp8` takes contiguous CUDA tensors (Hopper, compute capability 9.0) or CPU
tensors under Triton's interpreter (`TRITON_INTERPRET=1`, tests) for expert sizes `supported` accepts;
`experts_pairs_fp8_reference` is the twin on any device (float32 arithmetic, blocking). No host sync; the
launch grids are fixed by the shapes (CUDA-graph capturable).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from engine.kernels.fp8 import FP8, FP8_MAX, Fp8Experts, Quantized, quantize_rows
from engine.kernels.moe import fit_block, row_tiles
from engine.kernels.tiles import MoeTiles, shipped

try:  # Triton ships with CUDA builds of torch; CPU-only installs have the twin only.
    import triton
    from triton.tools.tensor_descriptor import TensorDescriptor

    from engine.kernels.moe_fp8_triton import (
        _moe_down_fp8_kernel,
        _moe_gate_up_fp8_kernel,
        _requant_rows_kernel,
    )

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False

SMALL = shipped().moe_fp8_small
"""FP8 expert kernel shapes for few rows per expert (a lone request): weight-read bound."""
LARGE = shipped().moe_fp8_large
"""FP8 expert kernel shapes for many rows per expert (large batches): tensor-core bound."""
LARGE_FROM_ROWS_PER_EXPERT = shipped().moe_fp8_large_from_rows_per_expert
"""Average rows per expert from which the gate/up GEMM takes `LARGE`'s shape."""
DOWN_LARGE_FROM_ROWS_PER_EXPERT = shipped().moe_fp8_down_large_from_rows_per_expert
"""Average rows per expert from which the down GEMM takes `LARGE`'s shape and the "row_pass" way; below it
`SMALL`'s, with "row_fused" (the requantisation in its loads, no pass of its own), whatever the gate/up
GEMM's regime. With a trained router's spread (levelled routing, one H100, `bench.one_request
--fp8-large-from-rows`; BENCHMARKS.md, "Targets, round nineteen"), us per request over 48 layers, small
down against large down plus its pass: 7,632 against 7,911 + 580 at 201 rows an expert, 10,499 against
10,460 + 790 at 301, 16,688 against 15,651 + 1,507 at 502, 25,888 against 23,334 + 2,605 at 800; while
the gate/up GEMM was faster on `LARGE` from 201 rows (11,189 against 11,351 us). Measured as a whole against
both GEMMs switching at 192 (round twenty): 0.68, 0.80 and 0.59 ms less GPU time for batches of 4, 6 and 10
records of 800 tokens. The value is `tiles.json`'s `moe_fp8.down_large_from_rows_per_expert`."""
GROUP = shipped().moe_fp8_group
"""Columns of the (S, I) activations per scale (the down GEMM's k step), where the expert size allows."""
SCALINGS = ("group", "row_pass", "row_fused", "row")
"""How the down GEMM applies the activations' scales: "group", one tensor-core product per group, scaled
and summed in float32; "row_pass", the activations requantised to one scale per row (the largest of its
groups) by a pass of their own, then one chained product; "row_fused", the same requantisation in the
down kernel's load; "row", "row_fused" where the down GEMM takes `SMALL` and "row_pass" where it takes
`LARGE` (`down_tiles_for`). The row ways give the same values (bit-equal on the GPU)."""
DOWN_SCALING = "row"
"""The way the engine runs (`SCALINGS`). One MoE layer, each at its best down shape (BENCHMARKS.md, round
seven): at 65,536 tokens 6,025 us with "row_pass", 6,206 with "row_fused", 6,741 with "group"; at 800
tokens 185.5 us with "row_fused", 192.6 with "row_pass", 188.3 with "group". The regimes differ in the
way only, not in the values, so a record's result does not depend on its batch's regime beyond
accumulation order."""


def tiles_for(pairs: int, experts: int) -> MoeTiles:
    """The regime of a call with `pairs` token-expert pairs over `experts` experts."""
    return LARGE if pairs >= LARGE_FROM_ROWS_PER_EXPERT * experts else SMALL


def down_tiles_for(pairs: int, experts: int) -> MoeTiles:
    """The down GEMM's regime of a call (`DOWN_LARGE_FROM_ROWS_PER_EXPERT`); `tiles_for` is the gate/up's."""
    return LARGE if pairs >= DOWN_LARGE_FROM_ROWS_PER_EXPERT * experts else SMALL


def group_for(inter: int) -> int:
    """The activation scale group for an expert size `inter`: `GROUP`, or the largest power of two below
    it dividing `inter` (small test models), 0 when none does."""
    return fit_block(GROUP, inter)


def supported(hidden: int, inter: int) -> bool:
    """Whether the Triton FP8 kernels take these expert sizes (multiples of 32: e4m3 tensor-core steps)."""
    return HAVE_TRITON and fit_block(32, hidden) >= 32 and group_for(inter) >= 32


def experts_pairs_fp8_reference(
    x: torch.Tensor,
    order: torch.Tensor,
    counts: torch.Tensor,
    top_w: torch.Tensor,
    q8: Fp8Experts,
    scaling: str | None = None,
) -> torch.Tensor:
    """The twin of `experts_pairs_fp8` with the same `scaling`, one expert at a time in float32 from the
    same e4m3 values and scales: (T k, H) bf16 in pair order (rows of pairs nobody routed to stay zero)."""
    row = (scaling or DOWN_SCALING) != "group"
    t, hidden = x.shape
    k = top_w.shape[1]
    inter = q8.down.shape[2]
    group = group_for(inter)
    xq, xs = quantize_rows(x)
    xf = xq.float() * xs[:, None]  # (T, H) dequantised
    y = torch.zeros(t * k, hidden, dtype=torch.bfloat16, device=x.device)
    flat_w = top_w.reshape(-1)
    start = 0
    for expert, n in enumerate(counts.tolist()):
        n = int(n)
        if not n:
            continue
        pairs = order[start : start + n].long()
        start += n
        w_gu = q8.gate_up[expert].float() * q8.gate_up_scale[expert][:, None]  # (2I, H) interleaved
        h = F.linear(xf.index_select(0, pairs // k), w_gu)  # (n, 2I) float32, as the kernel keeps it
        g, u = h[:, 0::2], h[:, 1::2]
        act = F.silu(g) * u * flat_w.index_select(0, pairs).float()[:, None]  # (n, I)
        blocks = act.reshape(n, inter // group, group)
        scale = blocks.abs().amax(dim=-1).clamp_min(1e-12) / FP8_MAX  # (n, I / group)
        q = (blocks / scale[..., None]).to(FP8).float()
        if row:  # requantised to the row's largest group scale
            top = scale.amax(dim=-1, keepdim=True)  # (n, 1)
            aq = (q * (scale / top)[..., None]).to(FP8).float() * top[..., None]
        else:
            aq = q * scale[..., None]  # dequantised, (n, I/G, G)
        w_dn = q8.down[expert].float() * q8.down_scale[expert][:, None]  # (H, I)
        y[pairs] = F.linear(aq.reshape(n, inter), w_dn).to(torch.bfloat16)
    return y


def experts_pairs_fp8(
    x: torch.Tensor,
    order: torch.Tensor,
    counts: torch.Tensor,
    top_w: torch.Tensor,
    q8: Fp8Experts,
    tiles: MoeTiles | None = None,
    scaling: str | None = None,
    xq: Quantized | None = None,
) -> torch.Tensor:
    """weight * down(silu(gate(x)) * up(x)) for every token-expert pair with e4m3 experts: (T k, H) bf16
    in pair order (token * k + j), not yet summed over a token's k experts.

    `x` (T, H) normalised hidden states in bf16; `order` (T k,) pair ids sorted by expert and `counts`
    (E,) as `engine.kernels.moe.group_by_expert` returns them; `top_w` (T, k) float32 routing weights;
    `q8` the layer's e4m3 experts (`engine.kernels.fp8.quantize_experts`). `tiles` overrides the regime
    (benchmarks); its down `block_k` is ignored (the down k step is the scale group). `scaling` (one of
    `SCALINGS`, default `DOWN_SCALING`) picks how the down GEMM applies the activations' scales. `xq`:
    x already quantised as `quantize_rows` does it ((T, H) e4m3, (T,) scales), e.g. by the RMSNorm before.
    """
    way = _way(scaling, top_w.numel(), q8.gate_up.shape[0])
    act, act_s = activations_fp8(x, order, counts, top_w, q8, tiles, row_pass=way == "row_pass", xq=xq)
    return down_pairs_fp8(act, act_s, order, counts, q8, x.shape[0], top_w.shape[1], tiles, way)


def _way(scaling: str | None, pairs: int, experts: int) -> str:
    # `scaling` (default `DOWN_SCALING`) with "row" resolved to its regime's way
    way = scaling or DOWN_SCALING
    if way == "row":
        way = "row_pass" if down_tiles_for(pairs, experts) is LARGE else "row_fused"
    return way


def activations_fp8(
    x: torch.Tensor,
    order: torch.Tensor,
    counts: torch.Tensor,
    top_w: torch.Tensor,
    q8: Fp8Experts,
    tiles: MoeTiles | None = None,
    *,
    row_pass: bool = True,
    xq: Quantized | None = None,
) -> Quantized:
    """The gate/up half of `experts_pairs_fp8` (same arguments): weight * silu(gate(x)) * up(x) of every
    pair in expert order, in e4m3: (S, I) and, with `row_pass`, (S,) float32 scales, one per row (the
    requantising pass), else (S, I / group) scales, one per row and `group` columns."""
    t, hidden = x.shape
    k = top_w.shape[1]
    experts, two_inter, _ = q8.gate_up.shape
    inter = two_inter // 2
    pairs = t * k
    group = group_for(inter)
    tl_ = tiles or tiles_for(pairs, experts)
    act = torch.empty(pairs, inter, dtype=FP8, device=x.device)  # expert order
    act_s = torch.empty(pairs, inter // group, dtype=torch.float32, device=x.device)
    if not t:
        return act, act_s[:, 0] if row_pass else act_s
    xq_, xs = xq if xq is not None else quantize_rows(x)  # (T, H) e4m3, (T,)
    shapes = {"hidden": hidden, "inter": inter, "e": experts, "e_pad": triton.next_power_of_2(experts)}
    gu = tl_.gate_up
    gu_n = max(fit_block(gu.block_n, inter), group)
    gu_k = fit_block(gu.block_k, hidden)
    # one (2 gu_n, gu_k) box of interleaved gate/up rows per k step
    w_gu: object = TensorDescriptor.from_tensor(q8.gate_up, [1, 2 * gu_n, gu_k]) if gu.tma else q8.gate_up
    _moe_gate_up_fp8_kernel[(row_tiles(pairs, experts, gu.block_m) * (inter // gu_n),)](
        xq_, xs, w_gu, q8.gate_up_scale, order, counts, top_w, act, act_s,
        **shapes, top_k=k, group=group, fp8_max=FP8_MAX,
        block_m=gu.block_m, block_n=gu_n, block_k=gu_k, stages=gu.stages, tma=gu.tma, num_warps=gu.warps,
    )  # fmt: skip
    if not row_pass:
        return act, act_s
    return act, requant_rows(act, act_s)


def requant_rows(act: torch.Tensor, act_s: torch.Tensor) -> torch.Tensor:
    """In place, each row of `act` (S, I) e4m3 brought from its (S, I / group) group scales `act_s` to one
    scale, the largest of them, which it returns (S,) float32 (the "row_pass" pass)."""
    pairs, inter = act.shape
    row_s = torch.empty(pairs, dtype=torch.float32, device=act.device)
    if pairs:
        _requant_rows_kernel[(triton.cdiv(pairs, 32),)](
            act, act_s, row_s, pairs, inter=inter, group=inter // act_s.shape[1], block_r=32, num_warps=4
        )
    return row_s


def down_pairs_fp8(
    act: torch.Tensor,
    act_s: torch.Tensor,
    order: torch.Tensor,
    counts: torch.Tensor,
    q8: Fp8Experts,
    tokens: int,
    top_k: int,
    tiles: MoeTiles | None = None,
    way: str = "row_pass",
) -> torch.Tensor:
    """The down half of `experts_pairs_fp8`: `activations_fp8`'s rows (row scales for "row_pass", group
    scales for "group" and "row_fused") times the down experts -> (T k, H) bf16 in pair order."""
    experts, hidden, inter = q8.down.shape
    pairs = tokens * top_k
    group = group_for(inter)
    y = torch.empty(pairs, hidden, dtype=torch.bfloat16, device=act.device)  # pair order
    if not tokens:
        return y
    shapes = {"hidden": hidden, "inter": inter, "e": experts, "e_pad": triton.next_power_of_2(experts)}
    dn = (tiles or down_tiles_for(pairs, experts)).down
    dn_n = fit_block(dn.block_n, hidden)
    if dn.tma:
        a_dn: object = TensorDescriptor.from_tensor(act, [dn.block_m, group])
        w_dn: object = TensorDescriptor.from_tensor(q8.down, [1, dn_n, group])
    else:
        a_dn, w_dn = act, q8.down
    _moe_down_fp8_kernel[(row_tiles(pairs, experts, dn.block_m) * (hidden // dn_n),)](
        a_dn, act_s, w_dn, q8.down_scale, order, counts, y,
        **shapes, group=group, block_m=dn.block_m, block_n=dn_n, stages=dn.stages, tma=dn.tma,
        scaling=SCALINGS.index(way), num_warps=dn.warps,
    )  # fmt: skip
    return y
