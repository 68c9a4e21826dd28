"""The FP8 expert mode's arithmetic on CPU (`engine.kernels.fp8`; the CUDA kernels are checked in
tests/gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from devtools.tiny_release import write_tiny_release
from engine.kernels import fp8
from engine.model.decoder import PackedInputs, PackedTextDecoder
from engine.model.release import load_release_model


def test_row_quantisation_keeps_each_row_within_one_e4m3_step() -> None:
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 2, 64)[:, None]
    q, scale = fp8.quantize_rows(x)
    assert q.dtype == fp8.FP8
    assert scale.shape == (64,)
    back = q.float() * scale[:, None]
    # e4m3 keeps 3 mantissa bits: relative error at most 2^-4 of the value, plus the smallest subnormal step
    assert ((back - x).abs() <= x.abs() / 16 + scale[:, None] * 2.0**-9).all()
    assert torch.allclose(q.float().abs().amax(dim=1), torch.full((64,), fp8.FP8_MAX))


def test_grouped_mm_twin_matches_float_matmul_per_group() -> None:
    gen = torch.Generator().manual_seed(1)
    sizes = [3, 0, 7, 5]
    a = torch.randn(sum(sizes), 32, generator=gen)
    w = torch.randn(4, 16, 32, generator=gen)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    aq, a_s = fp8.quantize_rows(a)
    wq, w_s = fp8.quantize_weight(w)
    out = fp8.grouped_mm(aq, a_s, wq, w_s, offs).float()
    exact = torch.cat(
        [a[s:e] @ w[g].T for g, (s, e) in enumerate(zip([0, 3, 3, 10], [3, 3, 10, 15], strict=True))]
    )
    assert out.shape == (15, 16)
    assert ((out - exact).norm() / exact.norm()).item() < 0.08


def test_experts_interleave_gate_and_up_rows_and_swiglu_reads_them_so() -> None:
    """`quantize_experts` stores gate channel n at row 2 n and up channel n at row 2 n + 1 (scales alike),
    and `swiglu_quantized` takes a GEMM's (S, 2I) output in that order."""
    gen = torch.Generator().manual_seed(2)
    e, inter, hidden = 3, 8, 32
    gate_up = torch.randn(e, 2 * inter, hidden, generator=gen)
    q8 = fp8.quantize_experts(gate_up, torch.randn(e, hidden, inter, generator=gen))
    halves_q, halves_s = fp8.quantize_weight(gate_up)
    assert torch.equal(q8.gate_up[:, 0::2].view(torch.uint8), halves_q[:, :inter].view(torch.uint8))
    assert torch.equal(q8.gate_up[:, 1::2].view(torch.uint8), halves_q[:, inter:].view(torch.uint8))
    assert torch.equal(q8.gate_up_scale[:, 0::2], halves_s[:, :inter])
    assert torch.equal(q8.gate_up_scale[:, 1::2], halves_s[:, inter:])
    g, u = torch.randn(5, inter, generator=gen), torch.randn(5, inter, generator=gen)
    w = torch.rand(5, generator=gen)
    q, s = fp8.swiglu_quantized(torch.stack((g, u), dim=-1).reshape(5, 2 * inter), w)
    want = torch.nn.functional.silu(g) * u * w[:, None]
    assert ((q.float() * s[:, None] - want).abs() <= want.abs().amax(dim=1, keepdim=True) / 16).all()


def test_fast_path_decoder_in_fp8_stays_near_full_precision_and_switches_back(tmp_path: Path) -> None:
    model = load_release_model(write_tiny_release(tmp_path / "tiny"), device="cpu", dtype=torch.float32).model
    text_model = model.text_model
    decoder = PackedTextDecoder(text_model)
    ids = torch.randint(0, 800, (50,), generator=torch.Generator().manual_seed(2))
    packed = PackedInputs(
        text_model.embed_tokens(ids),
        torch.arange(50)[None].expand(3, -1),
        torch.tensor([0, 20, 50]).int(),
        30,
    )
    with torch.inference_mode():
        full = decoder(packed)
        assert decoder.use_fp8_experts(True) > 0
        quantised = decoder(packed)
        decoder.use_fp8_experts(False)
        again = decoder(packed)
    assert torch.equal(full, again)
    drift = (full - quantised).abs().max().item()
    assert 0.0 < drift < 0.05 * full.abs().max().item()


def test_fp8_text_only_frees_the_bf16_experts_and_answers_as_fp8(tmp_path: Path) -> None:
    """Text-only FP8 empties every layer's bf16 expert weights, answers exactly as FP8 with them kept, and
    cannot be switched back to bf16."""
    path = write_tiny_release(tmp_path / "tiny")
    models = [load_release_model(path, device="cpu", dtype=torch.float32).model for _ in range(2)]
    ids = torch.randint(0, 800, (40,), generator=torch.Generator().manual_seed(3))
    out = []
    for model, text_only in zip(models, (False, True), strict=True):
        decoder = PackedTextDecoder(model.text_model)
        emb = model.text_model.embed_tokens(ids)
        packed = PackedInputs(emb, torch.arange(40)[None].expand(3, -1), torch.tensor([0, 40]).int(), 40)
        with torch.inference_mode():
            decoder.use_fp8_experts(True, text_only=text_only)
            out.append(decoder(packed))
        experts = [layer.mlp.experts for layer in model.text_model.layers]
        assert all((e.gate_up_proj.numel() == 0) == text_only for e in experts)
        assert all((e.down_proj.numel() == 0) == text_only for e in experts)
        assert decoder.text_only is text_only
    assert torch.equal(out[0], out[1])
    with pytest.raises(ValueError, match="FP8 text-only"):
        decoder.use_fp8_experts(False)


def test_linear_fp8_twin_matches_float_matmul_and_keeps_rows_independent() -> None:
    """The FP8 dense projection (`linear_fp8`) stays near the float product, adds the bias, and a row's
    result is the same alone and among other rows (its scale is its own)."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(24, 64, generator=gen) * torch.logspace(-2, 1, 24)[:, None]
    w = torch.randn(48, 64, generator=gen) * 0.1
    bias = torch.randn(48, generator=gen)
    lin = fp8.quantize_linear(w, bias)
    assert lin.weight.dtype == fp8.FP8
    assert lin.scale.shape == (48,)
    assert lin.nbytes == 48 * 64 + 48 * 4 + 48 * 4
    out = fp8.linear_fp8(x, lin)
    exact = x @ w.T + bias
    assert out.shape == (24, 48)
    assert ((out - exact).norm() / exact.norm()).item() < 0.08
    alone = fp8.linear_fp8(x[5:6], lin)
    assert torch.allclose(alone, out[5:6], rtol=1e-6, atol=1e-6)
    assert fp8.linear_fp8(x[:0], lin).shape == (0, 48)
    assert fp8.linear_supported(48, 64)
    assert not fp8.linear_supported(40, 64)


def test_linear_fp8_from_quantised_rows_alone_gives_the_same_bf16_result() -> None:
    """`linear_fp8` given only the rows' e4m3 form (the norm before kept no bf16 rows) answers as from the
    bf16 rows, in bf16; with neither it refuses."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(9, 64, generator=gen).bfloat16()
    lin = fp8.quantize_linear(torch.randn(32, 64, generator=gen) * 0.1)
    want = fp8.linear_fp8(x, lin)
    got = fp8.linear_fp8(None, lin, fp8.quantize_rows(x))
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want)
    assert fp8.linear_fp8(None, lin, fp8.quantize_rows(x[:0])).shape == (0, 32)
    with pytest.raises(ValueError, match="needs the rows"):
        fp8.linear_fp8(None, lin)


def test_fast_path_decoder_with_fp8_attention_stays_near_full_precision_and_switches_back(
    tmp_path: Path,
) -> None:
    """FP8 attention projections (alone and with FP8 experts) move the decoder's output a little, never to
    the same value, and switching back gives the full-precision output bit for bit."""
    model = load_release_model(write_tiny_release(tmp_path / "tiny"), device="cpu", dtype=torch.float32).model
    text_model = model.text_model
    decoder = PackedTextDecoder(text_model)
    ids = torch.randint(0, 800, (50,), generator=torch.Generator().manual_seed(5))
    packed = PackedInputs(
        text_model.embed_tokens(ids),
        torch.arange(50)[None].expand(3, -1),
        torch.tensor([0, 20, 50]).int(),
        30,
    )
    with torch.inference_mode():
        full = decoder(packed)
        copies = decoder.use_fp8_attention(True)
        attention_only = decoder(packed)
        decoder.use_fp8_experts(True)
        both = decoder(packed)
        decoder.use_fp8_experts(False)
        assert decoder.use_fp8_attention(False) == copies
        again = decoder(packed)
    attns = [layer.self_attn for layer in text_model.layers]
    qkv_rows = sum(a.q_proj.weight.shape[0] + 2 * a.k_proj.weight.shape[0] for a in attns)
    assert copies >= qkv_rows * text_model.config.hidden_size  # one e4m3 byte per weight at least
    assert torch.equal(full, again)
    scale = full.abs().max().item()
    for out in (attention_only, both):
        drift = (full - out).abs().max().item()
        assert 0.0 < drift < 0.05 * scale
    assert not torch.equal(attention_only, both)
