"""GPU: the CUDA gate/up kernel of the FP8 expert block (`engine.kernels.moe_fp8_sm90`, two-CTA clusters,
sm_90a) against the Triton kernel it would replace and against float32 arithmetic.

Builds the extension once (nvcc and ninja needed: `scripts/device-engine.sh tests` puts ninja on PATH)."""

from __future__ import annotations

import random
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from bench.gate_up_sm90_probe import dequantised
from bench.moe_fp8 import rel
from devtools.tiny_release import TinyReleaseSpec, write_tiny_release
from engine.batching.collate import collate
from engine.kernels import fp8, moe, moe_fp8, moe_fp8_sm90
from engine.runner import Engine, EngineConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_engine_gpu import _record

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

E, HIDDEN, INTER, TOP_K = 8, 256, 384, 2


@pytest.fixture(scope="module")
def ext() -> moe_fp8_sm90.Extension:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU (sm_90a)")
    if shutil.which("ninja") is None:
        pytest.skip("needs ninja on PATH to build the extension")
    # the benches' build folder: an up-to-date build there is loaded, not rebuilt
    return moe_fp8_sm90.build(moe_fp8_sm90.BUILD_DIR)


def _layer(gen: torch.Generator) -> fp8.Fp8Experts:
    gate_up = (torch.randn(E, 2 * INTER, HIDDEN, device="cuda", generator=gen) / HIDDEN**0.5).bfloat16()
    down = (torch.randn(E, HIDDEN, INTER, device="cuda", generator=gen) / INTER**0.5).bfloat16()
    return fp8.quantize_experts(gate_up, down)


def _routing(t: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    # (top_w (T, k) float32, top_i (T, k) int32): expert 0 takes every token (over 256 rows from T = 257 on:
    # three row tiles, the third pair tile's second CTA empty), expert 5 none, the rest at random
    rest = torch.tensor([1, 2, 3, 4, 6, 7], device="cuda")
    second = rest[torch.randint(0, 6, (t,), device="cuda", generator=gen)]
    top_i = torch.stack([torch.zeros_like(second), second], dim=1).int()
    top_w = torch.rand(t, TOP_K, device="cuda", generator=gen)
    return top_w / top_w.sum(dim=1, keepdim=True), top_i


@pytest.mark.parametrize("tokens", [1, 40, 300, 700])
def test_sm90_gate_up_matches_the_triton_kernel_and_float32(ext: moe_fp8_sm90.Extension, tokens: int) -> None:
    """Same e4m3 activations and scales as the Triton kernel up to rounding (the exponential and division
    differ in their last bits), and within e4m3 quantisation of float32 SwiGLU from the same operands."""
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    q8 = _layer(gen)
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen).bfloat16()
    top_w, top_i = _routing(tokens, gen)
    order, counts = moe.group_by_expert(top_i, E)
    xq = fp8.quantize_rows(x)
    act, act_s = moe_fp8_sm90.gate_up_fp8(ext, x, order, counts, top_w, q8, xq=xq)
    each, each_s = moe_fp8_sm90.gate_up_fp8(ext, x, order, counts, top_w, q8, xq=xq, clusters=1 << 30)
    assert torch.equal(each.view(torch.uint8), act.view(torch.uint8))  # persistent or not, same bytes
    assert torch.equal(each_s, act_s)
    solo, solo_s = moe_fp8_sm90.gate_up_fp8(ext, x, order, counts, top_w, q8, xq=xq, solo=True)
    assert torch.equal(solo.view(torch.uint8), act.view(torch.uint8))  # lone CTAs, no multicast
    assert torch.equal(solo_s, act_s)
    one, one_s = moe_fp8_sm90.gate_up_fp8(ext, x, order, counts, top_w, q8, xq=xq, clusters=1)
    assert torch.equal(one.view(torch.uint8), act.view(torch.uint8))  # one cluster loops over every item
    assert torch.equal(one_s, act_s)
    ref, ref_s = moe_fp8.activations_fp8(x, order, counts, top_w, q8, row_pass=False, xq=xq)
    assert act_s.shape == ref_s.shape == (tokens * TOP_K, INTER // 128)
    equal = float((act.view(torch.uint8) == ref.view(torch.uint8)).float().mean())
    rel_triton = rel(dequantised(act, act_s), dequantised(ref, ref_s))
    # float32: x[tok] . W^T with both scales, SwiGLU, routing weight, in expert order
    pairs = order.long()
    xf = xq[0].float() * xq[1][:, None]
    w = q8.gate_up.float() * q8.gate_up_scale[..., None]  # (E, 2I, H), rows interleaved
    expert = torch.repeat_interleave(torch.arange(E, device="cuda"), counts.long())
    h = torch.einsum("sh,snh->sn", xf[pairs // TOP_K], w[expert])
    exact = F.silu(h[:, 0::2]) * h[:, 1::2] * top_w.reshape(-1)[pairs][:, None]
    rel_exact = rel(dequantised(act, act_s), exact)
    print(f"T={tokens}: bytes equal {equal:.5f}, rel to Triton {rel_triton:.2e}, to float32 {rel_exact:.2e}")
    assert torch.allclose(act_s, ref_s, rtol=1e-4, atol=0.0)
    assert equal >= 0.98
    assert rel_triton <= 5e-3
    assert rel_exact <= 6e-2


@pytest.mark.parametrize("tokens", [1, 40, 300, 700])
def test_sm90_down_and_block_match_the_triton_kernels(ext: moe_fp8_sm90.Extension, tokens: int) -> None:
    """The CUDA down kernel gives the Triton kernel's bf16 rows ("row_pass") on the same activations, and the
    all-CUDA block stays as close to the float32 twin as the shipped one."""
    gen = torch.Generator(device="cuda").manual_seed(100 + tokens)
    q8 = _layer(gen)
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen).bfloat16()
    top_w, top_i = _routing(tokens, gen)
    order, counts = moe.group_by_expert(top_i, E)
    act, row_s = moe_fp8.activations_fp8(x, order, counts, top_w, q8, row_pass=True)
    ref = moe_fp8.down_pairs_fp8(act, row_s, order, counts, q8, tokens, TOP_K, way="row_pass")
    out = moe_fp8_sm90.down_fp8(ext, act, row_s, order, counts, q8)
    assert torch.equal(moe_fp8_sm90.down_fp8(ext, act, row_s, order, counts, q8, clusters=1 << 30), out)
    assert torch.equal(moe_fp8_sm90.down_fp8(ext, act, row_s, order, counts, q8, clusters=1), out)
    assert torch.equal(moe_fp8_sm90.down_fp8(ext, act, row_s, order, counts, q8, solo=True), out)
    equal = float((out == ref).float().mean())
    rel_down = rel(out, ref)
    twin = moe_fp8.experts_pairs_fp8_reference(x, order, counts, top_w, q8, "row_pass").float()
    shipped = rel(moe_fp8.experts_pairs_fp8(x, order, counts, top_w, q8), twin)
    cuda = rel(moe_fp8_sm90.experts_pairs_fp8(ext, x, order, counts, top_w, q8), twin)
    print(f"T={tokens}: down equal {equal:.5f}, rel {rel_down:.2e}; to the twin: {shipped:.2e} / {cuda:.2e}")
    assert rel_down <= 1e-3
    assert cuda <= max(2 * shipped, 1e-2)


def test_sm90_gate_up_replays_in_a_cuda_graph(ext: moe_fp8_sm90.Extension) -> None:
    """Captured in a CUDA graph, replays give the eager call's bytes, new inputs included."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    q8 = _layer(gen)
    x = torch.randn(300, HIDDEN, device="cuda", generator=gen).bfloat16()
    top_w, top_i = _routing(300, gen)
    order, counts = moe.group_by_expert(top_i, E)
    eager = moe_fp8_sm90.gate_up_fp8(ext, x, order, counts, top_w, q8)
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        moe_fp8_sm90.gate_up_fp8(ext, x, order, counts, top_w, q8)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, out_s = moe_fp8_sm90.gate_up_fp8(ext, x, order, counts, top_w, q8)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.uint8), eager[0].view(torch.uint8))
    assert torch.equal(out_s, eager[1])
    x.copy_(torch.randn(300, HIDDEN, device="cuda", generator=gen).bfloat16())
    graph.replay()
    again = moe_fp8_sm90.gate_up_fp8(ext, x, order, counts, top_w, q8)
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.uint8), again[0].view(torch.uint8))
    assert not torch.equal(out.view(torch.uint8), eager[0].view(torch.uint8))


@pytest.mark.parametrize("variant", list(moe_fp8_sm90.VARIANTS))
@pytest.mark.parametrize("tokens", [1, 300, 700])
def test_sm90_variant_builds_give_the_default_builds_bytes(
    ext: moe_fp8_sm90.Extension, tokens: int, variant: str
) -> None:
    """Each variant (`build(..., variant=...)`) changes when stages are freed, how rows are stored or how the
    warpgroups share the items out (64-row items in 128-row pair tiles), not what is computed: the same
    gate/up bytes and scales and the same down rows as the default build, persistent, one cluster per item and
    lone CTAs alike."""
    built = moe_fp8_sm90.build(moe_fp8_sm90.BUILD_DIR, variant=variant)
    gen = torch.Generator(device="cuda").manual_seed(200 + tokens)
    q8 = _layer(gen)
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen).bfloat16()
    top_w, top_i = _routing(tokens, gen)
    order, counts = moe.group_by_expert(top_i, E)
    act, act_s = moe_fp8_sm90.gate_up_fp8(ext, x, order, counts, top_w, q8)
    row, row_s = moe_fp8.activations_fp8(x, order, counts, top_w, q8, row_pass=True)
    down = moe_fp8_sm90.down_fp8(ext, row, row_s, order, counts, q8)
    for launch in ({}, {"clusters": 1 << 30}, {"solo": True}):
        got, got_s = moe_fp8_sm90.gate_up_fp8(built, x, order, counts, top_w, q8, **launch)
        assert torch.equal(got.view(torch.uint8), act.view(torch.uint8)), launch
        assert torch.equal(got_s, act_s), launch
        assert torch.equal(moe_fp8_sm90.down_fp8(built, row, row_s, order, counts, q8, **launch), down), (
            launch
        )


def _worst_dp(triton: list[Any], sm90: list[Any]) -> float:
    # the largest |dp| between two runs' answers: batches, then records, then questions
    worst = 0.0
    for a, b in zip(triton, sm90, strict=True):
        for x, y in zip(a, b, strict=True):
            for px, py in zip(x, y, strict=True):
                worst = max(worst, float(np.abs(px - py).max()))
    return worst


def test_the_engine_runs_large_batches_through_the_sm90_kernels_with_tritons_answers(
    ext: moe_fp8_sm90.Extension, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`EngineConfig.sm90_experts`: the engine builds the kernels at start (`engine.fast_path`); a batch of
    over `FROM_ROWS_PER_EXPERT` rows an expert runs both FP8 expert GEMMs through them, one of over
    `DOWN_FROM_ROWS_PER_EXPERT` its down GEMM only, a small one neither, all with the answers of the Triton
    kernels. A release the kernels take (hidden 256, experts of 128; 8 experts, 2 a token)."""
    path = write_tiny_release(tmp_path / "r", spec=TinyReleaseSpec(hidden_size=256, num_experts=8))
    rng = random.Random(21)
    sizes = ((1500, 2), (1200, 1), (900, 3), (800, 2), (700, 1))
    large = [_record(rng, n, q) for n, q in sizes]  # about 1,275 rows an expert
    mid = [_record(rng, n, q) for n, q in ((900, 2), (700, 1), (600, 3))]  # about 550
    small = [_record(rng, 300, 2)]  # about 75
    calls: list[str] = []
    both, down = moe_fp8_sm90.experts_pairs_fp8, moe_fp8_sm90.experts_pairs_fp8_down

    def counted_both(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append("both")
        return both(*args, **kwargs)  # type: ignore[arg-type]

    def counted_down(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append("down")
        return down(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(moe_fp8_sm90, "experts_pairs_fp8", counted_both)
    monkeypatch.setattr(moe_fp8_sm90, "experts_pairs_fp8_down", counted_down)
    answers = []
    for sm90 in (False, True):
        config = EngineConfig(device="cuda", fp8_experts=True, sm90_experts=sm90, graph_buckets=(512,))
        model = Engine.from_release(path, config=config).model
        assert model._fast is not None
        assert (model._fast.sm90_experts is not None) is sm90
        calls.clear()
        batches = [collate(b, layout="packed", device="cuda") for b in (large, mid, small)]
        answers.append([model.forward_batch(batch) for batch in batches])
        # two MoE layers: the large batch both GEMMs in each, the mid one the down GEMM, the small one none
        assert calls == (["both", "both", "down", "down"] if sm90 else [])
    worst = _worst_dp(*answers)
    print(f"sm90 against Triton through the engine: max |dp| {worst:.2e}")
    assert worst <= 1e-3


def test_graph_replays_through_the_sm90_kernels_give_tritons_answers(
    ext: moe_fp8_sm90.Extension, tmp_path: Path
) -> None:
    """Inside the CUDA graphs the bucket's size picks the kernels at capture (its padding tokens go to no
    expert): the 2,048-token bucket (512 rows an expert in the tiny release's 8 experts, 2 a token) runs the
    CUDA down kernel, the 4,096-token one both; the answers are the Triton graphs'."""
    path = write_tiny_release(tmp_path / "r", spec=TinyReleaseSpec(hidden_size=256, num_experts=8))
    rng = random.Random(22)
    in_2048 = [_record(rng, n, q) for n, q in ((800, 2), (600, 1))]
    in_4096 = [_record(rng, n, q) for n, q in ((1400, 3), (900, 2), (700, 1))]
    answers = []
    for sm90 in (False, True):
        buckets = (512, 2048, 4096)
        config = EngineConfig(device="cuda", fp8_experts=True, sm90_experts=sm90, graph_buckets=buckets)
        model = Engine.from_release(path, config=config).model
        assert model._graphed is not None
        sizes = [sum(len(r.input_ids) for r in b) for b in (in_2048, in_4096)]
        assert [model._graphed.bucket_for(t) for t in sizes] == [2048, 4096], sizes
        batches = [collate(b, layout="packed", device="cuda") for b in (in_2048, in_4096)]
        answers.append([model.forward_batch(batch) for batch in batches])
    worst = _worst_dp(*answers)
    print(f"sm90 against Triton in the graphs: max |dp| {worst:.2e}")
    assert worst <= 1e-3
