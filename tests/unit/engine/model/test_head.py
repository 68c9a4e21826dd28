"""The joint schema head (`engine.model.head`): parameter names, its attentions against the torch modules,
and on the tiny model batch invariance, padding invisibility and per-question normalisation."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from engine.batching.collate import Layout, collate, forward
from engine.model.head import JointHeadConfig, JointSchemaHead, head_state_dict_keys
from engine.model.head_layers import attend, attend_mask, decoder_layer
from engine.model.release import LoadedModel
from engine.types import EncodedRequest
from tests.unit.engine.conftest import make_record

MHA = ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")
LN = ("weight", "bias")


def documented_keys(routing_layers: int, layers: int) -> list[str]:
    """The SPEC section 4 key table, written out independently of the module code."""
    keys = [f"hidden_norm.{p}" for p in LN]
    keys += [
        f"{m}_projection.weight"
        for m in ("memory", "question", "option_question", "global", "option_context", "option_lexical")
    ]
    keys.append("type_embedding.weight")
    for i in range(routing_layers):
        r = f"evidence_layers.{i}"
        keys += [f"{r}.{n}.{p}" for n in ("query_norm", "memory_norm", "feedforward_norm") for p in LN]
        keys += [f"{r}.attention.{p}" for p in MHA] + [f"{r}.feedforward.{j}.{p}" for j in (0, 3) for p in LN]
    keys += [f"option_summary_norm.{p}" for p in LN]
    for i in range(layers):
        d = f"layers.{i}"
        keys += [f"{d}.self_attn.{p}" for p in MHA] + [f"{d}.multihead_attn.{p}" for p in MHA]
        keys += [f"{d}.{m}.{p}" for m in ("linear1", "linear2", "norm1", "norm2", "norm3") for p in LN]
    keys += [f"field_norm.{p}" for p in LN] + [f"option_norm.{p}" for p in LN]
    keys += [f"residual_scorer.{j}.{p}" for j in (0, 3) for p in LN]
    return [*keys, "prior_logit_scale", "joint_logit_scale", "residual_gate"]


def test_head_state_dict_keys_as_documented() -> None:
    config = JointHeadConfig(hidden_size=64, width=32, routing_layers=2, layers=3, heads=4, feedforward=64)
    keys = head_state_dict_keys(config)
    assert sorted(keys) == sorted(documented_keys(2, 3))
    assert len(keys) == 22 + 14 * 2 + 18 * 3  # SPEC section 4's count
    head = JointSchemaHead(config)
    assert head.prior_logit_scale.shape == torch.Size([])
    assert head.type_embedding.weight.shape == (3, 32)
    assert head.residual_scorer[0].weight.shape == (32, 128)
    assert head.residual_scorer[3].weight.shape == (1, 32)
    assert head.evidence_layers[0].feedforward[3].weight.shape == (32, 64)
    assert head.global_projection.weight.shape == (32, 64)


def _max_diff(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> float:
    return max(
        float(np.abs(x - y).max()) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)
    )


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_batch_invariance_float32(loaded: LoadedModel, records: list[EncodedRequest], layout: Layout) -> None:
    model = loaded.model
    alone = [model.forward_batch(collate([r], layout=layout))[0] for r in records]
    together = model.forward_batch(collate(records, layout=layout))
    assert _max_diff(alone, together) <= 1e-5
    order = [3, 0, 4, 2, 1]
    shuffled = model.forward_batch(collate([records[i] for i in order], layout=layout))
    assert _max_diff([together[i] for i in order], shuffled) <= 1e-5


def test_records_of_one_length_run_the_head_unmasked_and_match_alone(loaded: LoadedModel) -> None:
    """Records of equal length and question count have no padding: the head then attends without masks
    (as for a lone record), and each record still gets its answer alone."""
    rng = random.Random(11)
    same = [make_record(rng, 120, 2) for _ in range(3)]
    assert len({r.num_tokens for r in same}) == 1
    assert len({len(r.question_spans) for r in same}) == 1
    model = loaded.model
    alone = [model.forward_batch(collate([r]))[0] for r in same]
    together = model.forward_batch(collate(same))
    assert _max_diff(alone, together) <= 1e-5


def test_layouts_agree_and_padding_is_invisible(loaded: LoadedModel, records: list[EncodedRequest]) -> None:
    model = loaded.model
    packed = model.forward_batch(collate(records, layout="packed"))
    padded = model.forward_batch(collate(records, layout="padded", pad_token_id=7))
    padded_other = model.forward_batch(collate(records, layout="padded", pad_token_id=123))
    assert _max_diff(packed, padded) <= 1e-5
    assert _max_diff(padded, padded_other) <= 1e-6


def test_records_do_not_see_each_other(loaded: LoadedModel, records: list[EncodedRequest]) -> None:
    rng = random.Random(7)
    other = make_record(rng, 150, 2)
    first = loaded.model.forward_batch(collate([records[1], records[0]]))[1]
    second = loaded.model.forward_batch(collate([other, records[0]]))[1]
    assert _max_diff([first], [second]) <= 1e-5


def test_probabilities_shape_and_sum(loaded: LoadedModel, records: list[EncodedRequest]) -> None:
    out = forward(loaded.model, collate(records))
    for rec, answer in zip(records, out, strict=True):
        assert list(answer) == list(rec.question_ids)
        for probs, spans in zip(answer.values(), rec.option_spans, strict=True):
            assert probs.dtype == np.float32
            assert probs.shape == (len(spans),)
            assert np.isfinite(probs).all()
            assert (probs >= 0).all()
            assert abs(float(probs.sum()) - 1.0) <= 1e-5


def _padding(lengths: list[int], width: int) -> torch.Tensor:
    return torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None]  # (B, width) True = padding


@pytest.mark.parametrize("masked", [False, True])
def test_attend_and_decoder_layer_equal_the_torch_modules(masked: bool) -> None:
    """The head's own attention forward is nn.MultiheadAttention's and nn.TransformerDecoderLayer's
    (pre-norm, GELU, dropout 0), with and without padding masks, on the real rows."""
    torch.manual_seed(0)
    width, heads = 32, 4
    mha = torch.nn.MultiheadAttention(width, heads, dropout=0.0, batch_first=True).eval()
    layer = torch.nn.TransformerDecoderLayer(
        width, heads, 64, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
    ).eval()
    x, mem = torch.randn(3, 5, width), torch.randn(3, 9, width)
    x_pad = _padding([5, 2, 4], 5) if masked else None
    mem_pad = _padding([9, 3, 7], 9) if masked else None
    with torch.inference_mode():
        cross, _ = mha(x, mem, mem, key_padding_mask=mem_pad, need_weights=False)
        self_attention, _ = mha(x, x, x, key_padding_mask=x_pad, need_weights=False)
        decoded = layer(x, mem, tgt_key_padding_mask=x_pad, memory_key_padding_mask=mem_pad)
        x_mask, mem_mask = attend_mask(x_pad), attend_mask(mem_pad)
        got = (
            attend(mha, x, mem, mem_mask),
            attend(mha, x, x, x_mask),
            decoder_layer(layer, x, mem, x_mask, mem_mask),
        )
    real = ~x_pad if x_pad is not None else torch.ones(3, 5, dtype=torch.bool)
    for want, have in zip((cross, self_attention, decoded), got, strict=True):
        assert torch.allclose(want[real], have[real], atol=1e-5), float((want - have)[real].abs().max())
