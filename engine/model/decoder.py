"""Padding-free forward of the Qwen3-Omni thinker's text decoder over packed records (GPU fast path): the
plain layer loop. CUDA-graph replay of it lives in `engine.model.graphs`.

The transformers implementation runs a padded `(batch, length)` layout through generic modules. Here
every record of a batch is concatenated into one token axis `T` and attention is causal within each
record (`engine.kernels.attention`, one Triton kernel over cumulative sequence offsets), so no token ever
attends outside its own record and no compute is spent on padding. `triton_attention = False` runs
torch's variable-length FlashAttention 2 instead (`torch.nn.attention.varlen.varlen_attn`).
Per MoE layer (`engine.model.moe_block`): the router GEMM, `moe.route_topk`, one counting sort grouping
the pairs by expert (`moe.group_by_expert`), the experts through two fused Triton GEMMs
(`moe.experts_pairs` in bf16, `moe_fp8.experts_pairs_fp8` in FP8 mode) or, when `fused_experts` is off,
through CUTLASS grouped GEMMs (`torch.nn.functional.grouped_mm`, `torch._scaled_grouped_mm` in FP8), and
the per-token sum of the k expert outputs folded into the residual add and the next RMSNorm
(`elementwise.add_pairs_rms_norm`). A CUDA graph's padding tokens (`PackedInputs.valid`) skip the experts.

The module holds no weights of its own: it reads the parameters of an existing
`Qwen3OmniMoeThinkerTextModel`, so the strict loader stays the single source of truth. Fused QKV weights
are built once at construction (an extra copy of the attention projections, about 1 GB at full size).

Contract: `forward(...)` must be called under `torch.inference_mode()` on CUDA; it does not support
training, KV caches or sliding windows. Records are independent: the result for a record does not depend
on the other records of the pack beyond floating-point rounding in shared GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from engine.kernels import attention, elementwise, moe_fp8, moe_fp8_sm90
from engine.kernels import fp8 as fp8_mode
from engine.kernels.fp8 import Quantized
from engine.model import moe_block
from engine.model.pacer import LaunchPacer
from engine.types import Between


def varlen_available() -> bool:
    """Whether this torch build offers variable-length FlashAttention."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return hasattr(F, "grouped_mm") or hasattr(torch, "_grouped_mm")


@dataclass(frozen=True, slots=True)
class PackedInputs:
    """One packed batch on the device.

    `inputs_embeds` (T, hidden); `position_ids` (3, T) multimodal rope positions (identical rows for text);
    `cu_seqlens` (N+1,) int32 record boundaries; `max_seqlen` the longest record (text
    only: media batches take transformers' path, `engine.model.media`). `valid`: None when every token is
    a record's, else a (1,) int32 device tensor, the count of the records' tokens in front of padding (a
    CUDA graph's bucket tail, in records of its own): the experts then skip the padding tokens, whose
    outputs nobody reads.
    """

    inputs_embeds: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    valid: torch.Tensor | None = None


_rms_norm = elementwise.rms_norm_reference


class PackedTextDecoder:
    """Runs a transformers Qwen3-Omni thinker text model's layers over a packed token axis."""

    def __init__(self, text_model: Any, layers_ahead: int = 3) -> None:
        # Not an nn.Module itself: the text model's parameters stay registered once, in the thinker.
        self.text_model: Any = text_model
        self.layers_ahead = layers_ahead
        cfg: Any = text_model.config
        self.num_heads: int = cfg.num_attention_heads
        self.num_kv_heads: int = cfg.num_key_value_heads
        # transformers 5.17's Qwen3-Omni text config has no `head_dim` (hidden / heads); later ones may.
        self.head_dim: int = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps: float = cfg.rms_norm_eps
        self.top_k: int = cfg.num_experts_per_tok
        self.norm_topk: bool = bool(cfg.norm_topk_prob)
        self._qkv: list[torch.Tensor] = []
        self._fp8: list[fp8_mode.Fp8Experts | None] = []  # per layer, filled by `use_fp8_experts`
        self._fp8_on = False
        self._fp8_att: list[tuple[fp8_mode.Fp8Linear, fp8_mode.Fp8Linear] | None] = []  # per layer
        self._fp8_att_on = False
        self.text_only = False
        """The bf16 experts were dropped (`use_fp8_experts(text_only=True)`): FP8 only, and the
        transformers path (media) cannot run."""
        self.triton_attention = True
        """Attention through `engine.kernels.attention`'s Triton kernel (False: torch's varlen FlashAttention
        2). Recapture graphs after switching."""
        self.fused_experts = True
        """bf16 experts through `engine.kernels.moe`'s fused Triton kernels (False: gather, CUTLASS grouped
        GEMMs, SwiGLU and combine). Recapture graphs after switching."""
        self.sm90_experts: moe_fp8_sm90.Extension | None = None
        """Runs the GEMMs `moe_fp8_sm90.path_for` names (None: all Triton); recapture after a switch."""
        for layer in text_model.layers:
            att = layer.self_attn
            w = torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight], dim=0)
            self._qkv.append(w)  # (q + 2 kv, hidden)

    def _attention(
        self,
        i: int,
        layer: Any,
        x: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        p: PackedInputs,
        xq: Quantized | None = None,
    ) -> torch.Tensor:
        # `xq`: x already in e4m3 with its row scales (the RMSNorm before quantised it), FP8 attention only;
        # x is None when the norm before kept only those (`add_pairs_rms_norm_fp8`, `keep_normed`).
        from torch.nn.attention.varlen import varlen_attn

        att = layer.self_attn
        hq, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        q8 = self._fp8_att[i] if self._fp8_att_on else None
        if q8 is None:
            assert x is not None, "a bf16 QKV projection needs the bf16 rows"
            qkv = F.linear(x, self._qkv[i])  # (T, (hq + 2 hk) d)
        else:
            qkv = fp8_mode.linear_fp8(x, q8[0], xq)
        t = qkv.shape[0]
        qn, kn = att.q_norm.weight, att.k_norm.weight
        q, k, v = elementwise.qk_norm_rope(qkv, qn, kn, cos, sin, hq, hk, self.eps)
        if qkv.is_cuda and not (self.triton_attention and attention.supported(d)):
            got = varlen_attn(
                q, k, v, p.cu_seqlens, p.cu_seqlens, p.max_seqlen, p.max_seqlen, window_size=(-1, 0)
            )  # (T, hq, d)
            assert isinstance(got, torch.Tensor)
            out = got
        else:  # the Triton kernel on CUDA, one SDPA call per record on CPU
            out = attention.attention(q, k, v, p.cu_seqlens, p.max_seqlen)  # (T, hq, d)
        flat = out.reshape(t, hq * d)
        if q8 is not None:
            return fp8_mode.linear_fp8(flat, q8[1])
        return att.o_proj(flat)  # type: ignore[no-any-return]

    def use_fp8_attention(self, on: bool = True) -> int:
        """Run the attention projections (the fused QKV and the output projection) in e4m3 from the next
        forward on (`on`), or in bf16 (see `engine.kernels.fp8`, `linear_fp8`); the attention itself stays
        bf16. The first call with `on` quantises every layer's two projections (blocking, well under a
        second at full size) and keeps the copies (about 0.9 GB at full size), so switching is free; the
        bf16 weights stay (the transformers path and media batches use them). A layer whose sizes the
        scaled GEMM does not take (`fp8.linear_supported`) stays bf16. Recapture CUDA graphs after a
        switch. Returns the bytes the copies take.
        """
        self._fp8_att_on = on
        if on and not self._fp8_att:
            with torch.inference_mode():
                layers = enumerate(self.text_model.layers)
                self._fp8_att = [self._quantized_attention(i, layer) for i, layer in layers]
        return sum(qkv.nbytes + o.nbytes for qkv, o in filter(None, self._fp8_att))

    def _quantized_attention(
        self, i: int, layer: Any
    ) -> tuple[fp8_mode.Fp8Linear, fp8_mode.Fp8Linear] | None:
        # One layer's e4m3 QKV (from the fused copy) and output projection; None where a size does not fit.
        o_proj = layer.self_attn.o_proj
        shapes = (self._qkv[i].shape, o_proj.weight.shape)
        if not all(fp8_mode.linear_supported(n, k) for n, k in shapes):
            return None
        qkv = fp8_mode.quantize_linear(self._qkv[i])
        return qkv, fp8_mode.quantize_linear(o_proj.weight, getattr(o_proj, "bias", None))

    def use_fp8_experts(self, on: bool = True, *, text_only: bool = False) -> int:
        """Run the experts in FP8 (`on`) or bf16 from the next forward on (see `engine.kernels.fp8`).

        The first call with `on` quantises every MoE layer's experts to e4m3 (blocking, a few seconds at
        full size); the copies are kept, so switching back and forth is free. The bf16 weights stay, for
        the transformers path (media batches), unless `text_only`: then each layer's bf16 experts are
        freed as soon as its copy exists (peak: the bf16 model plus one layer), FP8 stays on for good
        (`on=False` raises ValueError) and `text_only` is set. CUDA graphs captured before a switch replay
        the old mode: recapture them (`ClefOmniModel.enable_fast_path` does). Returns the bytes the FP8
        copies take.
        """
        if self.text_only and not on:
            raise ValueError("the bf16 experts were dropped (FP8 text-only): FP8 cannot be turned off")
        self._fp8_on = on
        if on and not self._fp8:
            with torch.inference_mode():
                self._fp8 = [self._quantized(layer, drop=text_only) for layer in self.text_model.layers]
        elif on and text_only and not self.text_only:
            for layer in self.text_model.layers:
                if hasattr(layer.mlp, "experts"):
                    _drop_bf16_experts(layer.mlp.experts)
        self.text_only = self.text_only or (on and text_only)
        return sum(q.nbytes for q in self._fp8 if q is not None)

    @staticmethod
    def _quantized(layer: Any, drop: bool) -> fp8_mode.Fp8Experts | None:
        # One layer's e4m3 experts (None for a dense layer); with `drop` its bf16 experts are freed after.
        if not hasattr(layer.mlp, "experts"):
            return None
        experts = layer.mlp.experts
        q8 = fp8_mode.quantize_experts(experts.gate_up_proj, experts.down_proj)
        if drop:
            _drop_bf16_experts(experts)
        return q8

    def _moe_takes_fp8(self, i: int, x: torch.Tensor) -> bool:
        """Whether layer i's experts run the fused e4m3 kernels on `x` (T, hidden): they then take x
        already quantised per row (`_moe`'s `xq`), which the RMSNorm before them does in its own pass."""
        q8 = self._fp8[i] if self._fp8_on else None
        return (
            q8 is not None
            and self.fused_experts
            and x.is_cuda
            and moe_fp8.supported(x.shape[1], q8.down.shape[2])
        )

    def _moe(
        self,
        i: int,
        mlp: Any,
        x: torch.Tensor,
        xq: Quantized | None = None,
        valid: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Layer i's expert rows for `x` (T, hidden), not yet summed per token (`moe_block.expert_rows`,
        with this decoder's switches and layer i's e4m3 experts in FP8 mode)."""
        q8 = self._fp8[i] if self._fp8_on else None
        fused = self.fused_experts and x.is_cuda
        return moe_block.expert_rows(
            mlp, x, self.top_k, self.norm_topk, q8=q8, fused=fused, sm90=self.sm90_experts, xq=xq, valid=valid
        )

    def __call__(self, p: PackedInputs, between: Between | None = None) -> torch.Tensor:
        """Final RMS-normalised hidden states (T, hidden) for every packed token; `between` is called after
        every layer but the last (other GPU work may run there: it does not touch this forward's tensors)."""
        return self.layers(self.begin(p), p, 0, self.num_layers, between).h

    @property
    def num_layers(self) -> int:
        return len(self.text_model.layers)

    def begin(self, p: PackedInputs) -> DecoderState:
        """The state before layer 0: embeddings as the residual, their first RMSNorm, the rope tables."""
        tm = self.text_model
        x = p.inputs_embeds  # (T, hidden)
        cos, sin = tm.rotary_emb(x, p.position_ids[:, None, :])  # (1, T, d) each
        h = _rms_norm(x, tm.layers[0].input_layernorm.weight, self.eps)
        return DecoderState(x, h, cos[0].contiguous(), sin[0].contiguous())  # cos, sin (T, d)

    def layers(
        self, state: DecoderState, p: PackedInputs, start: int, end: int, between: Between | None = None
    ) -> DecoderState:
        """Layers [start, end) applied to `state`; after the last layer `h` is the final normalised output.
        A forward is `layers(begin(p), p, 0, num_layers)`, in any split of that range. `between`, when
        given, is called after each layer but the last of the range (never while a graph is captured)."""
        tm = self.text_model
        x, h, cos, sin = state.x, state.h, state.cos, state.sin
        layers: list[Any] = list(tm.layers)
        pacer = LaunchPacer(self.layers_ahead if x.is_cuda else 0)
        # The next layer's normalised input: in bf16 (None when its QKV reads the e4m3 rows only) and in e4m3
        # (FP8 attention). `h` inside a layer is the MLP's normalised input.
        hn: torch.Tensor | None = h
        hq: Quantized | None = None
        for i in range(start, end):
            layer = layers[i]
            pacer.step()
            att = self._attention(i, layer, hn, cos, sin, p, hq)
            mlp = layer.mlp
            routed = hasattr(mlp, "experts")
            post = layer.post_attention_layernorm.weight
            mq: Quantized | None = None
            if routed and self._moe_takes_fp8(i, x):  # the experts' row quantisation in the norm's pass
                x, h, mq = elementwise.add_rms_norm_fp8(x, att, post, self.eps)
            else:
                x, h = elementwise.add_rms_norm(x, att, post, self.eps)
            nxt = layers[i + 1].input_layernorm.weight if i + 1 < len(layers) else tm.norm.weight
            quant_next = self._fp8_att_on and x.is_cuda and i + 1 < end  # next layer's QKV input
            hq = None
            if routed:  # the per-token sum of the k experts inside the residual add
                rows, inv = self._moe(i, mlp, h, mq, p.valid)
                valid = p.valid if inv is None else None  # the rows the experts skipped are not summed
                if quant_next:  # the bf16 rows too only for a QKV the scaled GEMM does not take
                    keep = self._fp8_att[i + 1] is None
                    x, hn, hq = elementwise.add_pairs_rms_norm_fp8(
                        x, rows, inv, self.top_k, nxt, self.eps, keep_normed=keep, valid=valid
                    )
                else:
                    x, hn = elementwise.add_pairs_rms_norm(x, rows, inv, self.top_k, nxt, self.eps, valid)
            else:
                x, hn = elementwise.add_rms_norm(x, mlp(h), nxt, self.eps)
            if between is not None and i + 1 < end:
                between()
        assert hn is not None  # a range's last layer keeps its bf16 rows (`quant_next` is off there)
        return DecoderState(x, hn, cos, sin)


def _drop_bf16_experts(experts: Any) -> None:
    """Free a transformers MoE block's bf16 expert weights (FP8 text-only): the parameters stay, empty."""
    with torch.inference_mode(False):  # a parameter's data is swapped outside inference mode
        for name in ("gate_up_proj", "down_proj"):
            param = getattr(experts, name)
            param.data = torch.empty((0, *param.shape[1:]), dtype=param.dtype, device=param.device)


@dataclass(frozen=True, slots=True)
class DecoderState:
    """Between two layers of a packed forward: the residual stream `x` (T, hidden), its RMSNorm for the next
    layer `h` (T, hidden), and the rope tables `cos`, `sin` (T, head_dim)."""

    x: torch.Tensor
    h: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
