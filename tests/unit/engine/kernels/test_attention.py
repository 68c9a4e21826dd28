"""The packed causal attention of the fast path (`engine.kernels.attention`) on CPU: the PyTorch twin
against dense causal attention per record, and the Triton kernel under Triton's interpreter against the
twin. The CUDA kernel itself is checked in tests/gpu/test_attention_gpu.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from engine.kernels import attention

REPO = Path(__file__).resolve().parents[4]


def test_reference_is_causal_attention_within_each_record() -> None:
    gen = torch.Generator().manual_seed(0)
    lengths = [5, 1, 12]
    q, k, v = (torch.randn(sum(lengths), h, 16, generator=gen) for h in (4, 2, 2))
    cu = torch.tensor([0, 5, 6, 18], dtype=torch.int32)
    got = attention.attention(q, k, v, cu, max(lengths))
    start = 0
    for n in lengths:
        rows = slice(start, start + n)
        # dense attention over the record alone with an explicit lower-triangular mask, GQA by repeat
        qi = q[rows].transpose(0, 1)
        ki, vi = (t[rows].transpose(0, 1).repeat_interleave(2, dim=0) for t in (k, v))
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        want = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask).transpose(0, 1)
        assert torch.allclose(got[rows], want, atol=1e-5, rtol=1e-4)
        start += n


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_triton_kernel_under_the_interpreter_matches_the_reference() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    script = Path(__file__).with_name("attention_interpreted.py")
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("case ") == 24
