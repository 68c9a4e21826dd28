"""GPU: the Triton kernels launched with programmatic dependent launch (`engine.kernels.pdl`) give the bits of
plain launches, eagerly and replayed from CUDA graphs captured with the programmatic edges."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from devtools.tiny_release import write_tiny_release
from engine.batching.collate import collate
from engine.kernels import pdl
from engine.model.release import load_release_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_engine_gpu import _record

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_pdl_launches_give_the_bits_of_plain_launches_cuda(tmp_path: Path, fp8: bool) -> None:
    path = write_tiny_release(tmp_path / "tiny")
    rng = random.Random(21)
    records = [_record(rng, n, q) for n, q in ((40, 1), (300, 2), (900, 3), (1500, 2))]
    # one record and two (graph replays, buckets 512 and 1,024), then all four (2,700+ tokens: eager)
    groups = ([records[0]], records[:2], records)
    answers: dict[bool, list[list[list[np.ndarray]]]] = {}
    try:
        for on in (False, True):
            pdl.use(on)
            assert pdl.options(torch.empty(1, device="cuda"))["pdl"] is (
                on and torch.cuda.get_device_capability() >= (9, 0)
            )
            model = load_release_model(path, device="cuda", dtype=torch.bfloat16).model
            assert model.enable_fast_path(graph_buckets=(512, 1024), fp8_experts=fp8, fp8_attention=fp8)
            answers[on] = [model.forward_batch(collate(g, layout="packed", device="cuda")) for g in groups]
            del model
    finally:
        pdl.use(True)
    for plain, dependent in zip(answers[False], answers[True], strict=True):
        for a, b in zip(plain, dependent, strict=True):
            for x, y in zip(a, b, strict=True):
                assert np.array_equal(x, y)
