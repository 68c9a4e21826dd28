"""The packed causal attention of the fast path (`engine.kernels.attention`) on CPU: the PyTorch twin
against dense causal attention per record, the decoder with padding records behind a record (as graphs
run it), and the Triton kernel under Triton's interpreter against the twin. The CUDA kernel itself is
checked in tests/gpu/test_attention_gpu.py."""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from engine.kernels import attention
from engine.model.decoder import PackedInputs, PackedTextDecoder, graph_pieces
from engine.model.release import LoadedModel

REPO = Path(__file__).resolve().parents[3]


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


def test_decoder_with_padding_records_behind_a_record_equals_the_record_alone(loaded: LoadedModel) -> None:
    text_model = loaded.model.text_model
    decoder = PackedTextDecoder(text_model)
    ids = torch.randint(0, 800, (32,), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        emb = text_model.embed_tokens(ids)
        pos = torch.arange(32)[None].expand(3, -1)
        alone = decoder(PackedInputs(emb[:20], pos[:, :20], torch.tensor([0, 20]).int(), 20))
        padded_emb = torch.cat([emb[:20], torch.zeros_like(emb[20:])])
        cu = torch.tensor([0, 20, 28, 32, 32]).int()  # the record, padding records, an empty slot
        padded = decoder(PackedInputs(padded_emb, pos, cu, 20))
    assert torch.allclose(padded[:20], alone, atol=1e-5, rtol=1e-4)


def test_decoder_in_pieces_equals_the_whole_forward(loaded: LoadedModel) -> None:
    """Graphs capture the forward as `begin` and then layer ranges (`graph_pieces`): the pieces cover
    every layer once, in order, and chained they give the whole forward's output bit for bit."""
    text_model = loaded.model.text_model
    decoder = PackedTextDecoder(text_model)
    n = decoder.num_layers
    for layers in (1, 2, 3, 10, 48):
        pieces = graph_pieces(layers)
        assert pieces[0][0] == 0
        assert pieces[-1][1] == layers
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(pieces))
    ids = torch.randint(0, 800, (19,), generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        p = PackedInputs(
            text_model.embed_tokens(ids),
            torch.arange(19)[None].expand(3, -1),
            torch.tensor([0, 7, 19]).int(),
            12,
        )
        whole = decoder(p)
        for split in range(n + 1):
            state = decoder.layers(decoder.layers(decoder.begin(p), p, 0, split), p, split, n)
            assert torch.equal(state.h, whole), split


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_triton_kernel_under_the_interpreter_matches_the_reference() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    script = REPO / "tests" / "unit" / "engine" / "attention_interpreted.py"
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("case ") == 24
