"""The fused MoE expert path (`engine.moe`) on CPU: the PyTorch twin against transformers' own MoE block,
and the Triton kernels under Triton's interpreter against the twin. The CUDA kernels themselves are
checked in tests/gpu/test_moe_gpu.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import kernels, moe
from engine.release import LoadedModel

REPO = Path(__file__).resolve().parents[3]


def test_reference_experts_match_the_transformers_moe_block(loaded: LoadedModel) -> None:
    text_model = loaded.model.text_model
    layer = next(layer for layer in text_model.layers if hasattr(layer.mlp, "experts"))
    mlp = layer.mlp
    x = torch.randn(37, text_model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    k = text_model.config.num_experts_per_tok
    with torch.inference_mode():
        top_w, top_i = kernels.route_topk(torch.nn.functional.linear(x, mlp.gate.weight), k, True)
        flat = top_i.reshape(-1)
        counts = torch.bincount(flat, minlength=mlp.experts.gate_up_proj.shape[0]).to(torch.int32)
        got = moe.experts_reference(
            x, torch.argsort(flat), counts, top_w, mlp.experts.gate_up_proj, mlp.experts.down_proj
        )
        want = mlp(x[None])[0]  # transformers' block: router, top-k, experts, weighted sum
    assert got.shape == want.shape == x.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    assert float(got.abs().max()) > 1e-3


def test_tile_regime_and_supported_sizes() -> None:
    assert moe.tiles_for(800 * 8, 128) is moe.SMALL
    assert moe.tiles_for(65536 * 8, 128) is moe.LARGE
    assert moe.supported(2048, 768) == moe.HAVE_TRITON
    assert not moe.supported(2048, 40)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_triton_kernels_under_the_interpreter_match_the_reference() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    script = REPO / "tests" / "unit" / "engine" / "moe_interpreted.py"
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("case ") == 9
