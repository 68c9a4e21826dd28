"""GPU: the opt-in FP8 expert mode (`engine.kernels.fp8`, `engine.kernels.moe_fp8`): kernels against their
float32 twins, batch invariance, the text-only mode."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from devtools.tiny_release import write_tiny_release
from engine.batching.collate import collate
from engine.kernels import elementwise, fp8, moe, moe_fp8
from engine.model.release import load_release_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_engine_gpu import _record

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_fp8_kernels_match_their_float32_twins_cuda() -> None:
    """Row quantisation, the fused SwiGLU quantisation and the FP8 grouped GEMM on CUDA agree with the
    float32 arithmetic of their CPU twins (uneven groups, an empty group)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    e, hidden, inter = 8, 256, 128
    sizes = [5, 0, 70, 1, 33, 128, 9, 17]
    s = sum(sizes)
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    x = torch.randn(s, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(e, 2 * inter, hidden, device="cuda", generator=gen) * 0.05).to(torch.bfloat16)
    q, qs = fp8.quantize_rows(x)
    q_cpu, qs_cpu = fp8.quantize_rows(x.cpu())
    assert torch.allclose(qs.cpu(), qs_cpu, rtol=1e-6)
    assert (q.cpu().float() - q_cpu.float()).abs().max().item() <= 32.0  # one e4m3 step near 448 at most
    wq, ws = fp8.quantize_weight(w)
    out = fp8.grouped_mm(q, qs, wq, ws, offs).float()  # (S, 2I)
    ref = fp8.grouped_mm(q.cpu(), qs.cpu(), wq.cpu(), ws.cpu(), offs.cpu()).float()
    exact = torch.cat(
        [
            x[a:b].float().cpu() @ w[i].float().cpu().T
            for i, (a, b) in enumerate(zip([0, *offs.tolist()[:-1]], offs.tolist(), strict=True))
        ]
    )
    rel_kernel = ((out.cpu() - ref).norm() / ref.norm()).item()
    rel_quant = ((ref - exact).norm() / exact.norm()).item()
    print(f"fp8 grouped GEMM: rel err vs its twin {rel_kernel:.2e}; twin vs bf16 inputs {rel_quant:.2e}")
    assert rel_kernel <= 1e-2
    assert rel_quant <= 6e-2
    h = torch.randn(s, 2 * inter, device="cuda", generator=gen).to(torch.bfloat16)
    rw = torch.rand(s, device="cuda", generator=gen)
    a, a_s = fp8.swiglu_quantized(h, rw)
    a_cpu, a_s_cpu = fp8.swiglu_quantized(h.cpu(), rw.cpu())
    assert torch.allclose(a_s.cpu(), a_s_cpu, rtol=1e-4)
    deq = a.float().cpu() * a_s.cpu()[:, None]
    deq_cpu = a_cpu.float() * a_s_cpu[:, None]
    assert ((deq - deq_cpu).norm() / deq_cpu.norm()).item() <= 2e-2


def test_norms_that_quantise_give_the_bits_of_norm_then_quantize_rows_cuda() -> None:
    """`add_rms_norm_fp8` and `add_pairs_rms_norm_fp8` (the decoder's norms before FP8 GEMMs) return the
    norm's own outputs and the same e4m3 bits and scales as `fp8.quantize_rows` of the normed rows."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    t, hidden, k = 777, 2048, 8
    x = torch.randn(t, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    w = (1.0 + 0.1 * torch.randn(hidden, device="cuda", generator=gen)).to(torch.bfloat16)
    delta = torch.randn(t, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    rows = torch.randn(t * k, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    inv = torch.randperm(t * k, device="cuda", generator=gen).to(torch.int32)
    for fused, alone in (
        (elementwise.add_rms_norm_fp8(x, delta, w, 1e-6), elementwise.add_rms_norm(x, delta, w, 1e-6)),
        (
            elementwise.add_pairs_rms_norm_fp8(x, rows, inv, k, w, 1e-6),
            elementwise.add_pairs_rms_norm(x, rows, inv, k, w, 1e-6),
        ),
    ):
        y, n, (q, qs) = fused
        want_q, want_s = fp8.quantize_rows(alone[1])
        assert torch.equal(y, alone[0])
        assert torch.equal(n, alone[1])
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
        assert torch.equal(qs, want_s)


def test_fp8_experts_batch_invariance_cuda(tmp_path: Path) -> None:
    """With FP8 experts every scale is per row or channel, so records stay independent within 2e-3, and
    answers stay near bf16's."""
    model = load_release_model(
        write_tiny_release(tmp_path / "tiny"), device="cuda", dtype=torch.bfloat16
    ).model
    rng = random.Random(11)
    records = [_record(rng, n, q) for n, q in ((30, 1), (700, 3), (220, 2), (1500, 4), (64, 1), (400, 3))]
    assert model.enable_fast_path()
    bf16 = model.forward_batch(collate(records, layout="packed", device="cuda"))
    assert model.enable_fast_path(graph_buckets=(512, 4096), fp8_experts=True)
    alone = [model.forward_batch(collate([r], layout="packed", device="cuda"))[0] for r in records]
    together = model.forward_batch(collate(records, layout="packed", device="cuda"))
    worst_batch = drift = 0.0
    for rec in zip(alone, together, bf16, strict=True):
        for a, b, r in zip(*rec, strict=True):
            assert abs(float(b.sum()) - 1.0) <= 1e-4
            worst_batch = max(worst_batch, float(np.abs(a - b).max()))
            drift = max(drift, float(np.abs(b - r).max()))
    print(f"fp8 experts: max |dp| alone vs batch = {worst_batch:.2e}; vs bf16 = {drift:.2e}")
    assert worst_batch <= 2e-3
    assert drift <= 5e-2


FULL_SIZE = (2048, 768, 128, 8)
"""hidden, expert intermediate, experts and k of the full-size thinker."""


def _full_size_experts(seed: int) -> tuple[torch.Generator, torch.Tensor, torch.Tensor, fp8.Fp8Experts]:
    """A CUDA generator seeded `seed` and, drawn from it first, random full-size bf16 gate/up and down
    experts and their e4m3 copies: (generator, gate_up, down, q8); the test draws its inputs after."""
    hidden, inter, experts, _ = FULL_SIZE
    gen = torch.Generator(device="cuda").manual_seed(seed)
    gate_up = (torch.randn(experts, 2 * inter, hidden, device="cuda", generator=gen) / hidden**0.5).bfloat16()
    down = (torch.randn(experts, hidden, inter, device="cuda", generator=gen) / inter**0.5).bfloat16()
    return gen, gate_up, down, fp8.quantize_experts(gate_up, down)


@pytest.mark.parametrize("tokens", [300, 5000])
def test_triton_fp8_experts_match_their_twin_and_stay_near_bf16_cuda(tokens: int) -> None:
    """At full expert size, in both tile regimes: the fused FP8 kernels against their float32 twin (same
    e4m3 values and scales), and against the bf16 kernels and the unfused CUTLASS FP8 path; the first
    300 tokens' rows do not depend on the rest of the batch beyond accumulation order."""
    hidden, _, experts, k = FULL_SIZE
    gen, gate_up, down, q8 = _full_size_experts(3)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
    logits = torch.randn(tokens, experts, device="cuda", generator=gen)
    top_w, top_i = moe.route_topk(logits, k, True)
    order, counts = moe.group_by_expert(top_i, experts)
    got = moe_fp8.experts_pairs_fp8(x, order, counts, top_w, q8).float()
    twin = moe_fp8.experts_pairs_fp8_reference(x, order, counts, top_w, q8).float()
    bf16 = moe.experts_pairs(x, order, counts, top_w, gate_up, down).float()

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / b.norm())

    o2, offs, inv = moe.group_by_expert_inverse(top_i, experts)
    xq, xs = fp8.quantize_rows(x)
    src = o2 // k
    h = fp8.grouped_mm(fp8.gather_rows(xq, src), xs.index_select(0, src), q8.gate_up, q8.gate_up_scale, offs)
    aq, a_s = fp8.swiglu_quantized(h, top_w.reshape(-1)[o2])
    cutlass = fp8.grouped_mm(aq, a_s, q8.down, q8.down_scale, offs)[inv.long()].float()
    first = 300 * k
    o1, c1 = moe.group_by_expert(top_i[:300].contiguous(), experts)
    alone = moe_fp8.experts_pairs_fp8(x[:300].contiguous(), o1, c1, top_w[:300].contiguous(), q8).float()
    print(
        f"fp8 experts at {tokens} tokens: Triton vs twin {rel(got, twin):.2e}, vs bf16 {rel(got, bf16):.2e}; "
        f"CUTLASS FP8 vs bf16 {rel(cutlass, bf16):.2e}; first 300 tokens alone vs in batch "
        f"{float((alone - got[:first]).abs().max()):.2e}"
    )
    # Hopper's FP8 tensor cores do not accumulate in IEEE float32 (CUTLASS's fast accumulation, the unfused
    # path, neither): activations on an e4m3 rounding edge then flip a step against the float32 twin
    # (1.0e-02 measured at both sizes). An indexing fault would be of the outputs' own size.
    assert rel(got, twin) <= 3e-2
    assert rel(got, bf16) <= 1.5 * rel(cutlass, bf16)  # finer activation scales: no worse than CUTLASS
    assert float((alone - got[:first]).abs().max()) <= 1e-2 * float(got[:first].abs().max())


@pytest.mark.parametrize(("tokens", "valid"), [(896, 807), (3584, 3222), (8192, 8000)])
def test_a_graph_buckets_padding_goes_to_no_expert_and_the_rest_keeps_its_bits_cuda(
    tokens: int, valid: int
) -> None:
    """At full expert size, for the buckets of one request, a mid-size batch and the radix sort's sizes:
    with `valid` the padding tokens (here all of one state, as a bucket's tail is) are grouped nowhere, the
    fused FP8 and bf16 experts give the real pairs the rows they give without it, bit for bit (the tile
    regime follows the bucket's pairs either way), and the sums give the real tokens the same bits."""
    hidden, _, experts, k = FULL_SIZE
    gen, gate_up, down, q8 = _full_size_experts(5)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
    x[valid:] = x[valid]  # the padding: one state
    logits = torch.randn(tokens, experts, device="cuda", generator=gen)
    logits[valid:] = logits[valid]
    v = torch.tensor([valid], dtype=torch.int32, device="cuda")
    top_w, top_i = moe.route_topk(logits, k, True)
    pw, pi = moe.route_topk(logits, k, True, v)
    assert torch.equal(pw[:valid], top_w[:valid])
    assert torch.equal(pi[:valid], top_i[:valid])
    order, counts = moe.group_by_expert(top_i, experts)
    po, pc = moe.group_by_expert(pi, experts)
    real = valid * k
    assert int(pc.sum()) == real
    assert torch.equal(po[:real], order[order < real])
    busiest = (int(counts.max()), int(pc.max()))
    print(f"padding {tokens - valid} of {tokens} tokens: busiest expert {busiest[0]} rows, now {busiest[1]}")
    for name, run in (
        ("fp8", lambda o, c, w: moe_fp8.experts_pairs_fp8(x, o, c, w, q8)),
        ("bf16", lambda o, c, w: moe.experts_pairs(x, o, c, w, gate_up, down)),
    ):
        want = run(order, counts, top_w)[:real]
        got = run(po, pc, pw)[:real]
        assert torch.equal(got, want), name
    rows = moe_fp8.experts_pairs_fp8(x, po, pc, pw, q8)
    w = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
    y, n, (q, _qs) = elementwise.add_pairs_rms_norm_fp8(x, rows, None, k, w, 1e-6, valid=v)
    full = moe_fp8.experts_pairs_fp8(x, order, counts, top_w, q8)
    wy, wn, (wq, _wqs) = elementwise.add_pairs_rms_norm_fp8(x, full, None, k, w, 1e-6)
    assert n is not None
    assert torch.equal(y[:valid], wy[:valid])
    assert torch.equal(n[:valid], wn[:valid])
    assert torch.equal(q[:valid].view(torch.uint8), wq[:valid].view(torch.uint8))
    assert torch.equal(y[valid:], x[valid:])  # nothing added to the padding's residual


@pytest.mark.parametrize("tokens", [300, 5000])
def test_fp8_row_scalings_match_their_twin_and_each_other_cuda(tokens: int) -> None:
    """The row scalings of the FP8 down GEMM (`moe_fp8.SCALINGS`) at full expert size, both tile regimes:
    bit-equal to each other and to the default, near their float32 twin and the bf16 kernels, and a
    record's rows alone (the default way of its regime) equal to the same rows in a batch."""
    hidden, _, experts, k = FULL_SIZE
    gen, gate_up, down, q8 = _full_size_experts(4)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
    top_w, top_i = moe.route_topk(torch.randn(tokens, experts, device="cuda", generator=gen), k, True)
    order, counts = moe.group_by_expert(top_i, experts)
    fused = moe_fp8.experts_pairs_fp8(x, order, counts, top_w, q8, scaling="row_fused")
    passed = moe_fp8.experts_pairs_fp8(x, order, counts, top_w, q8, scaling="row_pass")
    twin = moe_fp8.experts_pairs_fp8_reference(x, order, counts, top_w, q8, "row_fused").float()
    group = moe_fp8.experts_pairs_fp8(x, order, counts, top_w, q8, scaling="group").float()
    bf16 = moe.experts_pairs(x, order, counts, top_w, gate_up, down).float()
    o1, c1 = moe.group_by_expert(top_i[:300].contiguous(), experts)
    default = moe_fp8.experts_pairs_fp8(x, order, counts, top_w, q8)
    alone = moe_fp8.experts_pairs_fp8(x[:300].contiguous(), o1, c1, top_w[:300].contiguous(), q8)

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.float() - b).norm() / b.norm())

    print(
        f"fp8 row scaling at {tokens} tokens: vs twin {rel(fused, twin):.2e}, vs bf16 {rel(fused, bf16):.2e} "
        f"(group scaling {rel(group, bf16):.2e}); pass == fused {torch.equal(fused, passed)}; alone vs batch "
        f"{float((alone.float() - fused[: 300 * k].float()).abs().max()):.2e}"
    )
    assert torch.equal(fused, passed)
    assert torch.equal(fused, default)
    assert rel(fused, twin) <= 3e-2  # the tensor cores' accumulation, as for the group scaling above
    assert rel(fused, bf16) <= 1.5 * rel(group, bf16)  # one scale per row: coarser, not far off
    assert float((alone.float() - fused[: 300 * k].float()).abs().max()) <= 1e-2 * float(alone.abs().max())


def test_fp8_text_only_frees_the_bf16_experts_and_answers_as_fp8_cuda(tmp_path: Path) -> None:
    """Text-only FP8 on the GPU: the bf16 experts are emptied and text answers are those of FP8 with the
    bf16 experts kept (the engine's refusal of media: tests/unit/engine/test_runner_fake.py)."""
    path = write_tiny_release(tmp_path / "tiny")
    rng = random.Random(12)
    records = [_record(rng, n, q) for n, q in ((40, 1), (300, 2), (900, 3))]
    answers = []
    for text_only in (False, True):
        model = load_release_model(path, device="cuda", dtype=torch.bfloat16).model
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        assert model.enable_fast_path(graph_buckets=(512, 1024), fp8_experts=True, text_only=text_only)
        torch.cuda.synchronize()
        grew = torch.cuda.memory_allocated() - before
        assert model.text_only is text_only
        answers.append(model.forward_batch(collate(records, layout="packed", device="cuda")))
        experts = [layer.mlp.experts for layer in model.text_model.layers]
        bf16_bytes = sum(e.gate_up_proj.nbytes + e.down_proj.nbytes for e in experts)
        print(f"text_only={text_only}: memory grew {grew} bytes; bf16 experts hold {bf16_bytes}")
        assert (bf16_bytes == 0) is text_only
        del model
    for a, b in zip(*answers, strict=True):
        for x, y in zip(a, b, strict=True):
            assert np.array_equal(x, y)


def test_fp8_attention_projection_matches_its_twin_cuda() -> None:
    """`linear_fp8` on CUDA (row-wise scaled GEMM) against the float32 twin of the same e4m3 values, at the
    full-size QKV shape, and a row alone against the same row in a batch."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(300, 2048, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(5120, 2048, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    lin = fp8.quantize_linear(w)
    got = fp8.linear_fp8(x, lin).float()
    cpu = fp8.Fp8Linear(lin.weight.cpu(), lin.scale.cpu(), None)
    twin = fp8.linear_fp8(x.cpu().float(), cpu)
    exact = x.float() @ w.float().T
    rel_twin = ((got.cpu() - twin).norm() / twin.norm()).item()
    rel_exact = ((got - exact).norm() / exact.norm()).item()
    alone = fp8.linear_fp8(x[7:8], lin).float()
    row = float((alone - got[7:8]).abs().max()) / float(got[7:8].abs().max())
    print(f"fp8 linear: rel err vs twin {rel_twin:.2e}; vs bf16 {rel_exact:.2e}; alone vs batch {row:.2e}")
    assert rel_twin <= 1e-2
    assert rel_exact <= 6e-2
    assert row <= 1e-2


def test_fp8_attention_batch_invariance_cuda(tmp_path: Path) -> None:
    """FP8 attention projections with FP8 experts: records stay independent within 2e-3 (graphs and eager),
    and answers stay near bf16's."""
    model = load_release_model(
        write_tiny_release(tmp_path / "tiny"), device="cuda", dtype=torch.bfloat16
    ).model
    rng = random.Random(13)
    records = [_record(rng, n, q) for n, q in ((30, 1), (700, 3), (220, 2), (1500, 4), (64, 1), (400, 3))]
    assert model.enable_fast_path()
    bf16 = model.forward_batch(collate(records, layout="packed", device="cuda"))
    assert model.enable_fast_path(graph_buckets=(512, 4096), fp8_experts=True, fp8_attention=True)
    alone = [model.forward_batch(collate([r], layout="packed", device="cuda"))[0] for r in records]
    together = model.forward_batch(collate(records, layout="packed", device="cuda"))
    worst_batch = drift = 0.0
    for rec in zip(alone, together, bf16, strict=True):
        for a, b, r in zip(*rec, strict=True):
            assert abs(float(b.sum()) - 1.0) <= 1e-4
            worst_batch = max(worst_batch, float(np.abs(a - b).max()))
            drift = max(drift, float(np.abs(b - r).max()))
    print(f"fp8 experts + attention: max |dp| alone vs batch = {worst_batch:.2e}; vs bf16 = {drift:.2e}")
    assert worst_batch <= 2e-3
    assert drift <= 5e-2


def test_fp8_attention_norm_without_bf16_rows_gives_the_same_answers_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MoE sum's norm that keeps only the e4m3 rows for the next FP8 QKV projection
    (`elementwise.add_pairs_rms_norm_fp8` without `keep_normed`) gives the bits of the one that also
    stores the bf16 rows, graphs and eager (a batch over the largest graph)."""
    model = load_release_model(
        write_tiny_release(tmp_path / "tiny"), device="cuda", dtype=torch.bfloat16
    ).model
    rng = random.Random(17)
    records = [_record(rng, n, q) for n, q in ((30, 1), (700, 3), (220, 2), (64, 1))]
    batches = [records[:1], records[1:3], records]
    assert model.enable_fast_path(graph_buckets=(512, 1024), fp8_experts=True, fp8_attention=True)
    lean = [model.forward_batch(collate(b, layout="packed", device="cuda")) for b in batches]

    norm = elementwise.add_pairs_rms_norm_fp8

    def keeping_bf16_rows(*args: Any, keep_normed: bool = True, **kwargs: Any) -> Any:
        return norm(*args, keep_normed=True, **kwargs)

    monkeypatch.setattr(elementwise, "add_pairs_rms_norm_fp8", keeping_bf16_rows)
    assert model.enable_fast_path(graph_buckets=(512, 1024), fp8_experts=True, fp8_attention=True)
    full = [model.forward_batch(collate(b, layout="packed", device="cuda")) for b in batches]
    for a_batch, b_batch in zip(lean, full, strict=True):
        for a_rec, b_rec in zip(a_batch, b_batch, strict=True):
            for a, b in zip(a_rec, b_rec, strict=True):
                assert np.array_equal(a, b)
