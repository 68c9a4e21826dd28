"""GPU: the fused MoE expert kernels (`engine.moe`) against the unfused CUTLASS path they replace, their
row independence (batch invariance), and the single-record dense attention against varlen attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from engine import kernels, moe

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _case(t: int, hidden: int, inter: int, experts: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(t, hidden, device="cuda", generator=gen).bfloat16()
    gate_up = (torch.randn(experts, 2 * inter, hidden, device="cuda", generator=gen) * 0.02).bfloat16()
    down = (torch.randn(experts, hidden, inter, device="cuda", generator=gen) * 0.02).bfloat16()
    logits = torch.randn(t, experts, device="cuda", generator=gen).bfloat16()
    top_w, top_i = kernels.route_topk(logits, k, True)
    flat = top_i.reshape(-1)
    order = torch.argsort(flat.to(torch.uint8))
    counts = torch.histc(flat, bins=experts, min=0, max=experts - 1).int()
    return x, order, counts, top_w, gate_up, down


def _unfused(
    x: torch.Tensor,
    order: torch.Tensor,
    counts: torch.Tensor,
    top_w: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
) -> torch.Tensor:
    k = top_w.shape[1]
    offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device="cuda")
    h = F.grouped_mm(x.index_select(0, order // k), gate_up.transpose(-2, -1), offs=offs)
    a = kernels.swiglu_weighted(h, top_w.reshape(-1)[order])
    y = F.grouped_mm(a, down.transpose(-2, -1), offs=offs)
    return kernels.combine(y, inv, k)


@pytest.mark.parametrize(
    "shape", [(300, 256, 128, 16, 4), (900, 2048, 768, 128, 8), (5000, 2048, 768, 128, 8)]
)
def test_fused_experts_match_the_unfused_path_cuda(shape: tuple[int, int, int, int, int]) -> None:
    case = _case(*shape, seed=1)
    want = _unfused(*case).float()
    for tiles in (moe.SMALL, moe.LARGE):
        x, order, counts, top_w, gate_up, down = case
        got = moe.experts_triton(x, order, counts, top_w, gate_up, down, tiles).float()
        err = float((got - want).abs().max() / want.abs().max())
        print(f"{shape} {tiles.gate_up.block_m}-row tiles: max |diff| / max = {err:.2e}")
        assert err <= 1e-2  # bf16 outputs: a few units in the last place at most


def test_fused_experts_rows_do_not_depend_on_the_batch_cuda() -> None:
    """The first 50 tokens alone get bit-identical outputs to the same tokens among 600 (same experts)."""
    x, order, counts, top_w, gate_up, down = _case(600, 2048, 768, 128, 8, seed=2)
    together = moe.experts_forward(x, order, counts, top_w, gate_up, down)
    head = 50
    flat_ids = _ids_of(order, counts, 600, 8)[:head].reshape(-1)
    alone_order = torch.argsort(flat_ids.to(torch.uint8))
    alone_counts = torch.histc(flat_ids, bins=128, min=0, max=127).int()
    alone = moe.experts_forward(x[:head], alone_order, alone_counts, top_w[:head], gate_up, down)
    assert torch.equal(alone, together[:head])


def _ids_of(order: torch.Tensor, counts: torch.Tensor, t: int, k: int) -> torch.Tensor:
    """(T, k) expert ids back from the sorted pairs and the per-expert counts."""
    experts = torch.repeat_interleave(torch.arange(counts.numel(), device="cuda"), counts.long())
    ids = torch.empty(t * k, dtype=torch.int32, device="cuda")
    ids[order] = experts.int()
    return ids.view(t, k)


def test_dense_layout_attention_matches_varlen_for_one_record_cuda() -> None:
    from torch.nn.attention.varlen import varlen_attn

    from engine import dense_attention
    from engine.dense_attention import DenseLayout

    gen = torch.Generator(device="cuda").manual_seed(3)
    n, pad, hq, hk, d = 700, 196, 32, 4, 128  # one record and the padding behind it, as graphs run it
    q, k, v = (torch.randn(n + pad, h, d, device="cuda", generator=gen).bfloat16() for h in (hq, hk, hk))
    cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
    want = varlen_attn(q[:n], k[:n], v[:n], cu, cu, n, n, window_size=(-1, 0))
    assert isinstance(want, torch.Tensor)
    got = dense_attention.attention(q, k, v, DenseLayout(1, n + pad))[:n]
    err = float((got.float() - want.float()).abs().max())
    print(f"dense layout (1 x {n + pad}) vs varlen, one record of {n}: max |diff| = {err:.2e}")
    assert err <= 2e-2
