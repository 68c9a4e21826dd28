"""The joint schema head's layers (`engine.model.head`): the evidence layer, the decoder layer's forward and
the attention both use, with the exact key names of the release (SPEC section 4).

Every attention of the head goes through `attend`: one `F.scaled_dot_product_attention` call per attention,
masked or not, so that a lone record and the same record in a padded batch take one kernel (see `attend`).
A batch's key padding masks are turned into SDPA masks once per head call (`attend_mask`) and shared by
every attention over the same keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


def two_layer(width_in: int, width_mid: int, width_out: int) -> nn.Sequential:
    """Linear, GELU (exact), Dropout(0), Linear: the released key numbering `.0` and `.3`."""
    return nn.Sequential(
        nn.Linear(width_in, width_mid), nn.GELU(), nn.Dropout(0.0), nn.Linear(width_mid, width_out)
    )


class EvidenceLayer(nn.Module):
    """Pre-norm evidence routing: q += MHA(LN_q(q), LN_m(m), LN_m(m)); q += FFN(LN_f(q))."""

    def __init__(self, width: int, heads: int, feedforward: int) -> None:
        super().__init__()
        self.query_norm = nn.LayerNorm(width)
        self.memory_norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, dropout=0.0, batch_first=True)
        self.feedforward_norm = nn.LayerNorm(width)
        self.feedforward = two_layer(width, feedforward, width)

    def forward(
        self, q: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """q: (B, O, w) option queries; memory: (B, L, w); memory_mask: `attend_mask` of the memory's
        (B, L) padding, or None when no row has padding."""
        q = q + attend(self.attention, self.query_norm(q), self.memory_norm(memory), memory_mask)  # (B, O, w)
        out: torch.Tensor = q + self.feedforward(self.feedforward_norm(q))  # (B, O, w)
        return out


def attend_mask(padding: torch.Tensor | None) -> torch.Tensor | None:
    """The SDPA mask (B, 1, 1, L), True = attend, of a (B, L) key padding mask (True = padding), or None.
    Built once per head call: every attention over the same keys takes the same mask."""
    return None if padding is None else ~padding[:, None, None, :]


def attend(
    attention: nn.MultiheadAttention, x: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None
) -> torch.Tensor:
    """`attention(x, memory, memory, key_padding_mask=padding)` (batch first, no weights returned)
    through one `F.scaled_dot_product_attention` call, masked or not: (B, n, w) for x (B, n, w) and
    memory (B, L, w); memory_mask is `attend_mask(padding)` of the (B, L) key padding, or None.
    Self-attention when `memory is x`.

    nn.MultiheadAttention computes masked and unmasked attention differently (its fused native path for
    self-attention treats a mask apart), so through it a lone record (no mask) and the same record in a
    padded batch get different roundings. Through this one call (and one SDPA kernel on CUDA, see
    `ClefOmniModel.forward_probabilities`) they agree within the SPEC's batch invariance
    (tests/gpu/test_engine_gpu.py; BENCHMARKS.md, "Engine, round five").
    """
    width = x.shape[-1]
    heads = attention.num_heads
    w, b = attention.in_proj_weight, attention.in_proj_bias
    if memory is x:
        q, k, v = F.linear(x, w, b).chunk(3, dim=-1)  # (B, n, w) each
    else:
        q = F.linear(x, w[:width], None if b is None else b[:width])  # (B, n, w)
        k, v = F.linear(memory, w[width:], None if b is None else b[width:]).chunk(2, dim=-1)  # (B, L, w)
    out = F.scaled_dot_product_attention(
        _split_heads(q, heads), _split_heads(k, heads), _split_heads(v, heads), attn_mask=memory_mask
    )  # (B, heads, n, w / heads)
    projected: torch.Tensor = attention.out_proj(out.transpose(1, 2).flatten(2))  # (B, n, w)
    return projected


def _split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    return t.reshape(t.shape[0], t.shape[1], heads, -1).transpose(1, 2)  # (B, n, w) -> (B, heads, n, w/heads)


def decoder_layer(
    layer: nn.TransformerDecoderLayer,
    x: torch.Tensor,
    memory: torch.Tensor,
    x_mask: torch.Tensor | None,
    memory_mask: torch.Tensor | None,
) -> torch.Tensor:
    """`layer(x, memory, tgt_key_padding_mask=x_pad, memory_key_padding_mask=memory_pad)` for the head's
    pre-norm GELU decoder layers (dropout 0), with every attention through `attend`: (B, K, w). The masks
    are `attend_mask(x_pad)` and `attend_mask(memory_pad)`."""
    n1 = layer.norm1(x)
    x = x + attend(layer.self_attn, n1, n1, x_mask)
    x = x + attend(layer.multihead_attn, layer.norm2(x), memory, memory_mask)
    out: torch.Tensor = x + layer.linear2(F.gelu(layer.linear1(layer.norm3(x))))
    return out
