"""One MoE layer's experts on the packed decoder's fast path (`engine.model.decoder.PackedTextDecoder`): the
router, top-k, the grouping by expert and the experts, by whichever kernels the layer's mode takes, up to
the rows of every token-expert pair. The per-token sum of those rows is the decoder's (it folds into the
residual add and the next RMSNorm, `engine.kernels.elementwise.add_pairs_rms_norm`).

Contract: pure functions of their arguments; CUDA-graph capturable on the fused paths (no host sync).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from engine.kernels import elementwise, moe, moe_fp8, moe_fp8_sm90
from engine.kernels import fp8 as fp8_mode
from engine.kernels.fp8 import Quantized


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """(S, K) rows grouped by `offs` times per-group (G, K, N) -> (S, N)."""
    if hasattr(F, "grouped_mm"):
        return F.grouped_mm(a, b, offs=offs)
    return torch._grouped_mm(a, b, offs=offs)


def expert_rows(
    mlp: Any,
    x: torch.Tensor,
    k: int,
    norm_topk: bool,
    *,
    q8: fp8_mode.Fp8Experts | None,
    fused: bool,
    sm90: moe_fp8_sm90.Extension | None,
    xq: Quantized | None = None,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The experts' outputs for `x` (T, hidden) of transformers' MoE block `mlp`, each weighted by its
    routing weight, not yet summed per token: (T k, hidden) in pair order and None from the fused kernels,
    else (S, hidden) in expert order and the (T k,) slot of each pair in it.

    `q8`: the layer's e4m3 experts (FP8 mode), else the bf16 ones of `mlp` run. `fused`: the fused Triton
    kernels where they take the sizes (CUDA only), else gather, CUTLASS grouped GEMMs, SwiGLU. `sm90`: the
    FP8 calls run the GEMMs `moe_fp8_sm90.path_for` names through these CUDA kernels. `xq`: x in e4m3 with
    its row scales,
    used by the fused FP8 kernels. `valid` (`PackedInputs.valid`): on the pair-order paths the padding
    tokens go to no expert and their rows are left unwritten (the sum must then take `valid` too); the
    expert-order paths run every token.
    """
    experts = mlp.experts
    num_experts = mlp.gate.weight.shape[0]  # the router's rows (the bf16 experts may be dropped)
    inter = q8.down.shape[2] if q8 is not None else experts.down_proj.shape[2]
    fused_fp8 = q8 is not None and fused and moe_fp8.supported(x.shape[1], inter)
    fused_bf16 = q8 is None and fused and moe.supported(x.shape[1], inter)
    # transformers' router module has no `bias` attribute (the release's router has none); a bias is
    # honoured when one is set on it (benches set one to skew expert load).
    logits = F.linear(x, mlp.gate.weight, getattr(mlp.gate, "bias", None))  # (T, E)
    pair_order = fused_fp8 or fused_bf16
    top_w, top_i = moe.route_topk(logits, k, norm_topk, valid if pair_order else None)  # (T, k) each
    if pair_order:
        order, counts = moe.group_by_expert(top_i, num_experts)  # (S,) by expert, (E,)
        if q8 is None:  # gather, SwiGLU and the inverse permutation inside two Triton GEMMs
            return moe.experts_pairs(x, order, counts, top_w, experts.gate_up_proj, experts.down_proj), None
        path = None if sm90 is None else moe_fp8_sm90.path_for(top_w.numel(), num_experts, x.shape[1], inter)
        if sm90 is not None and path is not None:
            both = path == "both"  # else the down GEMM alone, after Triton's gate/up
            through = moe_fp8_sm90.experts_pairs_fp8 if both else moe_fp8_sm90.experts_pairs_fp8_down
            return through(sm90, x, order, counts, top_w, q8, xq=xq), None
        return moe_fp8.experts_pairs_fp8(x, order, counts, top_w, q8, xq=xq), None  # (T k, hidden)
    # (S,) pairs by expert, (E,) cumulative counts (grouped_mm's offs), (S,) sorted slot of each pair
    order, offs, inv = moe.group_by_expert_inverse(top_i, num_experts)
    if q8 is not None:
        x8, x_scale = fp8_mode.quantize_rows(x)  # (T, hidden) e4m3, (T,)
        src = order // k  # (S,) token of each sorted pair
        h8 = fp8_mode.grouped_mm(
            fp8_mode.gather_rows(x8, src),
            x_scale.index_select(0, src),
            q8.gate_up,
            q8.gate_up_scale,
            offs,
        )  # (S, 2I) bf16
        aq, a_scale = fp8_mode.swiglu_quantized(h8, top_w.reshape(-1)[order])  # (S, I) e4m3, (S,)
        y8 = fp8_mode.grouped_mm(aq, a_scale, q8.down, q8.down_scale, offs)  # (S, hidden) bf16
        return y8, inv  # (S, hidden) expert order
    xs = x.index_select(0, order // k)  # (S, hidden)
    h = _grouped_mm(xs, experts.gate_up_proj.transpose(-2, -1), offs)  # (S, 2I)
    a = elementwise.swiglu_weighted(h, top_w.reshape(-1)[order])  # (S, I)
    y = _grouped_mm(a, experts.down_proj.transpose(-2, -1), offs)  # (S, hidden)
    return y, inv  # (S, hidden) expert order
