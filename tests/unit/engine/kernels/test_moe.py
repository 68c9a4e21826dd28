"""The MoE block (`engine.kernels.moe`) on CPU: the PyTorch twins against transformers' own MoE block, the
expert kernels under Triton's interpreter against the twin, and the routing-side grouping kernel and the
per-token sum kernels (`engine.kernels.elementwise`) under the interpreter against PyTorch. The CUDA
kernels themselves are checked in tests/gpu/test_moe_gpu.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.kernels import elementwise, moe
from engine.model.release import LoadedModel

REPO = Path(__file__).resolve().parents[4]


def test_reference_experts_match_the_transformers_moe_block(loaded: LoadedModel) -> None:
    text_model = loaded.model.text_model
    layer = next(layer for layer in text_model.layers if hasattr(layer.mlp, "experts"))
    mlp = layer.mlp
    x = torch.randn(37, text_model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    k = text_model.config.num_experts_per_tok
    with torch.inference_mode():
        top_w, top_i = moe.route_topk(torch.nn.functional.linear(x, mlp.gate.weight), k, True)
        order, counts = moe.group_by_expert(top_i, mlp.experts.gate_up_proj.shape[0])
        got = moe.experts_forward(x, order, counts, top_w, mlp.experts.gate_up_proj, mlp.experts.down_proj)
        want = mlp(x[None])[0]  # transformers' block: router, top-k, experts, weighted sum
    assert got.shape == want.shape == x.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    assert float(got.abs().max()) > 1e-3


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_grouping_twin_is_a_stable_argsort_and_a_histogram(dtype: torch.dtype) -> None:
    top_i = torch.tensor([[3, 0], [0, 3], [2, 0], [3, 2]], dtype=dtype)  # expert 1 empty
    order, counts = moe.group_by_expert(top_i, 5)
    assert order.tolist() == [1, 2, 5, 4, 7, 0, 3, 6]
    assert order.dtype == counts.dtype == torch.int32
    assert counts.tolist() == [3, 0, 2, 3, 0]
    order2, ends, inv = moe.group_by_expert_inverse(top_i, 5)
    assert torch.equal(order2, order)
    assert ends.tolist() == [3, 3, 5, 8, 8]
    assert torch.equal(order[inv.long()], torch.arange(8, dtype=torch.int32))


def test_the_twins_send_a_graph_buckets_padding_to_no_expert_and_sum_nothing_for_it() -> None:
    """`valid` on CPU (the twins): the tokens from valid[0] on get id E and weight 0, are grouped nowhere,
    and their residual takes 0 without their rows being read; the other tokens keep their bits."""
    gen = torch.Generator().manual_seed(5)
    t, v, e, k, hidden = 9, 6, 5, 2, 16
    valid = torch.tensor([v], dtype=torch.int32)
    logits = torch.randn(t, e, generator=gen)
    want_w, want_i = moe.route_topk(logits, k, True)
    top_w, top_i = moe.route_topk(logits, k, True, valid)
    assert torch.equal(top_w[:v], want_w[:v])
    assert torch.equal(top_i[:v], want_i[:v])
    assert top_i[v:].eq(e).all()
    assert top_w[v:].eq(0).all()
    order, counts = moe.group_by_expert(top_i, e)
    assert counts.tolist() == torch.bincount(want_i[:v].reshape(-1), minlength=e).tolist()
    assert torch.equal(order[: v * k].long(), torch.argsort(want_i[:v].reshape(-1), stable=True))
    x = torch.randn(t, hidden, generator=gen)
    w = torch.randn(hidden, generator=gen)
    rows = torch.randn(t * k, hidden, generator=gen)
    rows[v * k :] = float("nan")
    y, n = elementwise.add_pairs_rms_norm(x, rows, None, k, w, 1e-6, valid)
    want = elementwise.add_pairs_rms_norm(x[:v], rows[: v * k], None, k, w, 1e-6)
    assert torch.equal(y[:v], want[0])
    assert torch.equal(n[:v], want[1])
    assert torch.equal(y[v:], x[v:])
    assert torch.equal(n[v:], elementwise.rms_norm_reference(x[v:], w, 1e-6))
    with pytest.raises(AssertionError, match="pair order"):
        elementwise.add_pairs_rms_norm(x, rows, torch.arange(t * k, dtype=torch.int32), k, w, 1e-6, valid)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pair_sums_in_the_residual_norm_are_combine_then_add_rms_norm_on_cpu(dtype: torch.dtype) -> None:
    """The CPU twin of the fused sum + add + RMSNorm keeps the two-step numbers bit for bit."""
    gen = torch.Generator().manual_seed(4)
    t, hidden, k = 11, 64, 3
    x = torch.randn(t, hidden, generator=gen).to(dtype)
    w = torch.randn(hidden, generator=gen).to(dtype)
    rows = torch.randn(t * k, hidden, generator=gen).to(dtype)
    inv = torch.randperm(t * k, generator=gen).to(torch.int32)
    for index in (None, inv):
        got = elementwise.add_pairs_rms_norm(x, rows, index, k, w, 1e-6)
        want = elementwise.add_rms_norm(x, elementwise.combine(rows, index, k), w, 1e-6)
        assert all(torch.equal(g, v) for g, v in zip(got, want, strict=True))


def test_tile_regime_and_supported_sizes() -> None:
    assert moe.tiles_for(800 * 8, 128) is moe.SMALL
    assert moe.tiles_for(65536 * 8, 128) is moe.LARGE
    assert moe.supported(2048, 768) == moe.HAVE_TRITON
    assert not moe.supported(2048, 40)


def _interpreted(script: str) -> str:
    """stdout of `script` (beside this file) run under Triton's interpreter; fails the test on exit != 0."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    path = Path(__file__).with_name(script)
    done = subprocess.run(
        [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


_needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="no Triton")


@_needs_triton
def test_triton_kernels_under_the_interpreter_match_the_reference() -> None:
    assert _interpreted("moe_interpreted.py").count("case ") == 9


@_needs_triton
def test_fp8_expert_kernels_under_the_interpreter_match_their_twin() -> None:
    out = _interpreted("moe_fp8_interpreted.py")
    assert out.count("case ") == 31  # 3 sizes x (4 scalings x 2 tile sets + 2 row-scaling comparisons), split
    assert out.count("row_pass == row_fused True") == 6
    assert "case split gate/up large, down small True" in out


@_needs_triton
def test_grouping_and_pair_sum_kernels_under_the_interpreter_match_torch() -> None:
    out = _interpreted("glue_interpreted.py")
    lines = out.splitlines()
    assert out.count("case group ") == 7
    assert sum(line.startswith("case group ") and line.endswith("exact True") for line in lines) == 7
    assert out.count("case sums ") == 4
    assert out.count("case quant ") == 3
    assert out.count("bit_equal True") == 3
    assert out.count("case padding ") == 4
    assert sum(line.startswith("case padding ") and line.endswith("exact True") for line in lines) == 4
