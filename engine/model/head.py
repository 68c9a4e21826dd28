"""Joint schema head (SPEC section 4): plain PyTorch, vectorised over a whole batch.

The head reads the thinker's final normalised hidden states of every record of a batch (flattened to one
`(T, hidden)` matrix of real tokens, records back to back) and the lexical table E (the thinker's `lm_head`
weight), and returns one float32 probability per option, in the order of `SpanIndex` (records, then questions,
then options in `option_table` order). Everything is gathered with index tensors built by
`engine.batching.collate`; there is no Python loop over records, questions or options in `forward`.

State-dict keys (exactly what a released `joint_head.safetensors` holds, SPEC section 4; `R` = routing_layers,
`N` = layers; 22 + 14 R + 18 N tensors):
    hidden_norm.{weight,bias}                                LayerNorm(hidden)
    memory_projection.weight, question_projection.weight,    bias-free Linear(hidden -> width) each
    option_question_projection.weight, global_projection.weight,
    option_context_projection.weight, option_lexical_projection.weight
    type_embedding.weight                                    Embedding(3, width)
    evidence_layers.{0..R-1}.query_norm.{weight,bias}        LN_q
    evidence_layers.{i}.memory_norm.{weight,bias}            LN_m
    evidence_layers.{i}.attention.{in_proj_weight,in_proj_bias,out_proj.weight,out_proj.bias}
    evidence_layers.{i}.feedforward_norm.{weight,bias}       LN_f
    evidence_layers.{i}.feedforward.{0,3}.{weight,bias}      Linear, GELU, Dropout, Linear
    option_summary_norm.{weight,bias}                        LN_sum
    layers.{0..N-1}.<torch.nn.TransformerDecoderLayer keys>  self_attn.*, multihead_attn.*, linear1.*,
                                                             linear2.*, norm1.*, norm2.*, norm3.*
    field_norm.{weight,bias}, option_norm.{weight,bias}      LN_field, LN_opt
    residual_scorer.{0,3}.{weight,bias}                      Linear(4w, w), GELU, Dropout, Linear(w, 1)
    prior_logit_scale, joint_logit_scale, residual_gate      0-d scalars
The dropouts (p = 0, no parameters) hold place 2 of the two Sequentials, so that their second Linear is `.3`
as in the release.

Reading of the SPEC formula: the option vector `o` used both in `cos(field, LN_opt(o))` and in the residual
scorer is the normalised one, `LN_opt(o)`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from engine.batching.collate import SpanIndex, segment_mean, segment_softmax
from engine.model.head_layers import EvidenceLayer, attend_mask, decoder_layer, two_layer

_MAX_LOG_SCALE = math.log(100.0)


@dataclass(frozen=True, slots=True)
class JointHeadConfig:
    """`joint_head_config.json`: sizes of the head (dense Clef: 1024 / 2 / 4 / 16 / 4096)."""

    hidden_size: int
    width: int = 1024
    routing_layers: int = 2
    layers: int = 4
    heads: int = 16
    feedforward: int = 4096

    @classmethod
    def from_json(cls, path: Path) -> JointHeadConfig:
        """Read the config strictly: every key required, no unknown key. Raises ValueError."""
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError(f"{path.name}: expected a JSON object")
        names = ("hidden_size", "width", "routing_layers", "layers", "heads", "feedforward")
        missing = [k for k in names if k not in raw]
        unknown = sorted(set(raw) - set(names))
        if missing or unknown:
            raise ValueError(f"{path.name}: missing keys {missing}, unknown keys {unknown}")
        values = {k: raw[k] for k in names}
        for key, value in values.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{path.name}: {key} must be a positive integer, got {value!r}")
        if values["width"] % values["heads"] != 0:
            raise ValueError(f"{path.name}: width {values['width']} not divisible by heads {values['heads']}")
        return cls(**values)

    def to_json(self) -> str:
        """`joint_head_config.json`'s text: every field, in declaration order."""
        return json.dumps(asdict(self), indent=2)


def _scale(param: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.clamp(param.float(), max=_MAX_LOG_SCALE))  # () float32


def _to_padded(
    flat: torch.Tensor, row: torch.Tensor, slot: torch.Tensor, rows: int, width: int
) -> torch.Tensor:
    """Scatter (N, D) rows into a zero (rows, width, D) tensor at [row, slot]."""
    out = flat.new_zeros(rows, width, flat.shape[-1])  # (rows, width, D)
    out[row, slot] = flat
    return out


class JointSchemaHead(nn.Module):
    """The joint schema head. `forward` is pure tensor code over one batch (see module docstring)."""

    def __init__(self, config: JointHeadConfig) -> None:
        super().__init__()
        self.config = config
        hidden, width = config.hidden_size, config.width
        self.hidden_norm = nn.LayerNorm(hidden)
        self.memory_projection = nn.Linear(hidden, width, bias=False)
        self.question_projection = nn.Linear(hidden, width, bias=False)
        self.option_question_projection = nn.Linear(hidden, width, bias=False)
        self.global_projection = nn.Linear(hidden, width, bias=False)
        self.option_context_projection = nn.Linear(hidden, width, bias=False)
        self.option_lexical_projection = nn.Linear(hidden, width, bias=False)
        self.type_embedding = nn.Embedding(3, width)
        self.evidence_layers = nn.ModuleList(
            EvidenceLayer(width, config.heads, config.feedforward) for _ in range(config.routing_layers)
        )
        self.option_summary_norm = nn.LayerNorm(width)
        self.layers = nn.ModuleList(
            nn.TransformerDecoderLayer(
                d_model=width,
                nhead=config.heads,
                dim_feedforward=config.feedforward,
                dropout=0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(config.layers)
        )
        self.field_norm = nn.LayerNorm(width)
        self.option_norm = nn.LayerNorm(width)
        self.residual_scorer = two_layer(4 * width, width, 1)
        self.prior_logit_scale = nn.Parameter(torch.tensor(math.log(10.0)))
        self.joint_logit_scale = nn.Parameter(torch.tensor(math.log(10.0)))
        self.residual_gate = nn.Parameter(torch.tensor(0.0))

    def forward(self, hidden: torch.Tensor, lexical_table: torch.Tensor, index: SpanIndex) -> torch.Tensor:
        """Per-option probabilities, float32, shape (N,), softmax-normalised within each question.

        hidden: (T, hidden) final normalised thinker states of the batch's real tokens, records back to back.
        lexical_table: (V, hidden) the thinker's `lm_head.weight` (E).
        index: the batch's span tables, already on `hidden.device`.
        """
        h = self.hidden_norm(hidden)  # (T, H)
        pooled = _pool(h, lexical_table, index, hidden.dtype)
        # Memory: (B, L, w), padded per record; padding is masked out of every attention below.
        mem = _to_padded(
            self.memory_projection(h),
            index.token_record,
            index.token_position,
            index.num_records,
            index.max_length,
        )  # (B, L, w)
        mem_mask, q_mask = _attend_masks(h, index)
        o = self._route_options(pooled, mem, mem_mask, index)  # (N, w)
        field = self._fields(o, pooled, index)  # (Q, w)
        f = self._decode_fields(field, mem, q_mask, mem_mask, index)  # (N, w)
        return self._probabilities(f, o, pooled, index)  # (N,) float32

    def _route_options(
        self, pooled: _Pooled, mem: torch.Tensor, mem_mask: torch.Tensor | None, index: SpanIndex
    ) -> torch.Tensor:
        """The option vectors (N, w) after the evidence layers attended them to their record's memory."""
        o = (
            self.option_context_projection(pooled.c)
            + self.option_lexical_projection(pooled.lex)
            + self.option_question_projection(pooled.q)[index.option_question]
        )  # (N, w)
        o_pad = _to_padded(
            o, index.option_record, index.option_slot, index.num_records, index.max_options
        )  # (B, O, w)
        for layer in self.evidence_layers:
            o_pad = layer(o_pad, mem, mem_mask)  # (B, O, w)
        return o_pad[index.option_record, index.option_slot]  # (N, w)

    def _fields(self, o: torch.Tensor, pooled: _Pooled, index: SpanIndex) -> torch.Tensor:
        """The field vector (Q, w) of each question: its projection, the attention-weighted summary of its
        options `o` (N, w), its record's global vector and its question type."""
        width = self.config.width
        opt_q = index.option_question
        wq = self.question_projection(pooled.q)  # (Q, w)
        o32 = o.float()  # (N, w) float32, cast once for both uses
        scores = (o32 * wq.float()[opt_q]).sum(-1) / math.sqrt(width)  # (N,) float32
        weights = segment_softmax(scores, opt_q, index.num_questions)  # (N,) float32
        summary = torch.zeros(index.num_questions, width, dtype=torch.float32, device=o.device)  # (Q, w)
        summary.index_add_(0, opt_q, weights[:, None] * o32)  # (Q, w)
        field: torch.Tensor = (
            wq
            + self.option_summary_norm(summary.to(pooled.q.dtype))
            + self.global_projection(pooled.g)[index.question_record]
            + self.type_embedding(index.question_type)
        )  # (Q, w)
        return field

    def _decode_fields(
        self,
        field: torch.Tensor,
        mem: torch.Tensor,
        q_mask: torch.Tensor | None,
        mem_mask: torch.Tensor | None,
        index: SpanIndex,
    ) -> torch.Tensor:
        """The fields (Q, w) through the decoder layers over the memory (masks: `attend_mask`),
        normalised, one row per option of their question: (N, w)."""
        f_pad = _to_padded(
            field, index.question_record, index.question_slot, index.num_records, index.max_questions
        )  # (B, K, w)
        for layer in self.layers:
            f_pad = decoder_layer(
                cast(nn.TransformerDecoderLayer, layer), f_pad, mem, q_mask, mem_mask
            )  # (B, K, w)
        f: torch.Tensor = self.field_norm(f_pad[index.question_record, index.question_slot])
        return f[index.option_question]  # (N, w)

    def _probabilities(
        self, f: torch.Tensor, o: torch.Tensor, pooled: _Pooled, index: SpanIndex
    ) -> torch.Tensor:
        """Softmax within each question of each option's prior, joint and residual scores: (N,) float32."""
        opt_q = index.option_question
        on = self.option_norm(o)  # (N, w)
        joint = F.cosine_similarity(f.float(), on.float(), dim=-1)  # (N,) float32
        residual = (
            self.residual_scorer(torch.cat([f, on, f * on, (f - on).abs()], dim=-1)).squeeze(-1).float()
        )  # (N,)
        anchor = (pooled.q + pooled.g[index.question_record])[opt_q]  # (N, H)
        prior = (F.normalize(pooled.lex.float(), dim=-1) * F.normalize(anchor.float(), dim=-1)).sum(
            -1
        )  # (N,)
        gate = torch.sigmoid(self.residual_gate.float())  # () float32
        logits = _scale(self.prior_logit_scale) * prior + gate * (
            _scale(self.joint_logit_scale) * joint + residual
        )  # (N,) float32
        return segment_softmax(logits, opt_q, index.num_questions)  # (N,) float32


@dataclass(frozen=True, slots=True)
class _Pooled:
    """A batch's normalised hidden states pooled per record, question and option, in the hidden dtype."""

    g: torch.Tensor  # (B, H) each record's last token
    q: torch.Tensor  # (Q, H) mean over each question's tokens
    c: torch.Tensor  # (N, H) mean over each option's tokens
    lex: torch.Tensor  # (N, H) mean of each option's lexical-table rows


def _pool(h: torch.Tensor, lexical_table: torch.Tensor, index: SpanIndex, dtype: torch.dtype) -> _Pooled:
    """`_Pooled` of the normalised states `h` (T, H); the means are cast to `dtype`."""
    g = h[index.last_token]  # (B, H)
    q = segment_mean(h, index.question_tokens, index.question_segment, index.question_length).to(
        dtype
    )  # (Q, H)
    c = segment_mean(h, index.option_tokens, index.option_segment, index.option_length).to(dtype)  # (N, H)
    lex_rows = lexical_table[index.option_token_ids].to(dtype)  # (Mo, H)
    lex = segment_mean(lex_rows, None, index.option_segment, index.option_length).to(dtype)  # (N, H)
    return _Pooled(g, q, c, lex)


def _attend_masks(h: torch.Tensor, index: SpanIndex) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """`attend_mask` of the (B, L) memory and (B, K) question padding, or None where no record is padded
    (a lone record, or records of one length: the sizes alone tell, no sync). The masks cost a lone
    request more than the attentions themselves (BENCHMARKS.md, "Engine, round four")."""
    records = index.num_records
    mem_pad = None if h.shape[0] == records * index.max_length else index.memory_padding
    q_pad = None if index.num_questions == records * index.max_questions else index.question_padding
    return attend_mask(mem_pad), attend_mask(q_pad)


def head_state_dict_keys(config: JointHeadConfig) -> list[str]:
    """The exact, ordered state-dict keys of a head with this config (built on the meta device)."""
    with torch.device("meta"):
        return list(JointSchemaHead(config).state_dict().keys())
