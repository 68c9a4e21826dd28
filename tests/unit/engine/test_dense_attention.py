"""The dense-layout attention of the fast path (`engine.dense_attention`) on CPU: against per-record causal
attention, alone and inside the packed decoder for one record with padding behind it (as graphs run it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from engine import dense_attention
from engine.dense_attention import DenseLayout
from engine.fastpath import PackedInputs, PackedTextDecoder
from engine.release import LoadedModel


def _per_record(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    outs, start = [], 0
    for n in lengths:
        qi, ki, vi = (t[start : start + n].transpose(0, 1) for t in (q, k, v))
        outs.append(
            F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, enable_gqa=True).transpose(0, 1)
        )
        start += n
    return torch.cat(outs)


def test_attention_through_the_layout_equals_per_record_attention() -> None:
    gen = torch.Generator().manual_seed(0)
    for rows, length in ((1, 50), (8, 64), (3, 17)):
        t = rows * length
        q, k, v = (torch.randn(t, h, 16, generator=gen) for h in (8, 2, 2))
        got = dense_attention.attention(q, k, v, DenseLayout(rows, length))
        assert got.shape == (t, 8, 16)
        assert torch.allclose(got, _per_record(q, k, v, [length] * rows), atol=1e-5, rtol=1e-4)


def test_decoder_with_one_record_and_trailing_padding_equals_the_record_alone(loaded: LoadedModel) -> None:
    text_model = loaded.model.text_model
    decoder = PackedTextDecoder(text_model)
    ids = torch.randint(0, 800, (32,), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        emb = text_model.embed_tokens(ids)
        pos = torch.arange(32)[None].expand(3, -1)
        alone = decoder(PackedInputs(emb[:20], pos[:, :20], torch.tensor([0, 20]).int(), 20))
        padded_emb = torch.cat([emb[:20], torch.zeros_like(emb[20:])])
        cu = torch.tensor([0, 32]).int()
        dense = decoder(PackedInputs(padded_emb, pos, cu, 32, dense=DenseLayout(1, 32)))
    assert torch.allclose(dense[:20], alone, atol=1e-5, rtol=1e-4)
