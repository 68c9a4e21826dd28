"""GPU: the fused MoE expert kernels (`engine.kernels.moe`) against the unfused CUTLASS path they replace,
their
row independence (batch invariance)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from engine.kernels import elementwise, moe

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
    top_w, top_i = moe.route_topk(logits, k, True)
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
    a = elementwise.swiglu_weighted(h, top_w.reshape(-1)[order])
    y = F.grouped_mm(a, down.transpose(-2, -1), offs=offs)
    return elementwise.combine(y, inv, k)


@pytest.mark.parametrize(
    "shape", [(300, 256, 128, 16, 4), (900, 2048, 768, 128, 8), (5000, 2048, 768, 128, 8)]
)
def test_fused_experts_match_the_unfused_path_cuda(shape: tuple[int, int, int, int, int]) -> None:
    case = _case(*shape, seed=1)
    want = _unfused(*case).float()
    for tiles in (moe.SMALL, moe.LARGE):
        x, order, counts, top_w, gate_up, down = case
        got = moe.experts_forward(x, order, counts, top_w, gate_up, down, tiles).float()
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


def _routed_ids(t: int, k: int, experts: int, seed: int, skewed: bool) -> torch.Tensor:
    """(T, k) int32 expert ids from `moe.route_topk` on random logits; `skewed`: expert 0 never
    chosen, expert 1 by every token, as an untrained router does."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(t, experts, device="cuda", generator=gen)
    if skewed:
        logits[:, 0] = -1e4
        logits[:, 1] += 1e4
    return moe.route_topk(logits.bfloat16(), k, True)[1]


@pytest.mark.parametrize("tokens", [807, 65536])
@pytest.mark.parametrize("skewed", [False, True])
def test_group_by_expert_is_a_stable_argsort_and_bincount_cuda(tokens: int, skewed: bool) -> None:
    """The counting sort against torch, exactly (k = 8 of E = 128), eager and replayed in a CUDA graph
    on ids it was not captured with."""
    k, experts = 8, 128
    top_i = _routed_ids(tokens, k, experts, seed=5, skewed=skewed)

    def check(ids: torch.Tensor, got: tuple[torch.Tensor, ...]) -> None:
        order, counts, order2, ends, inv = got
        flat = ids.reshape(-1)
        want_counts = torch.bincount(flat, minlength=experts)
        assert torch.equal(order.long(), torch.argsort(flat, stable=True))
        assert torch.equal(counts.long(), want_counts)
        assert torch.equal(order2, order)
        assert torch.equal(ends.long(), torch.cumsum(want_counts, 0))
        assert torch.equal(order.long()[inv.long()], torch.arange(flat.numel(), device="cuda"))

    def group(ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            *moe.group_by_expert(ids, experts),
            *moe.group_by_expert_inverse(ids, experts),
        )

    check(top_i, group(top_i))
    static = top_i.clone()
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        group(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = group(static)
    other = _routed_ids(tokens, k, experts, seed=6, skewed=not skewed)
    static.copy_(other)
    graph.replay()
    torch.cuda.synchronize()
    check(other, out)
    print(
        f"{tokens} tokens x {k}, skewed {skewed}: {int((torch.bincount(other.reshape(-1)) == 0).sum())} empty"
    )


@pytest.mark.parametrize("tokens", [807, 65536])
def test_pair_sums_fold_into_the_residual_rms_norm_cuda(tokens: int) -> None:
    """`add_pairs_rms_norm` against `combine` then `add_rms_norm` (the same numbers: bit for bit), both
    row layouts against each other, and against a float32 reference within bf16 rounding."""
    hidden, k = 2048, 8
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
    w = (1.0 + 0.1 * torch.randn(hidden, device="cuda", generator=gen)).bfloat16()
    rows = (0.3 * torch.randn(tokens * k, hidden, device="cuda", generator=gen)).bfloat16()  # pair order
    inv = torch.randperm(tokens * k, device="cuda", generator=gen).int()
    by_expert = torch.empty_like(rows)
    by_expert[inv.long()] = rows  # pair p in row inv[p]
    y, h = elementwise.add_pairs_rms_norm(x, rows, None, k, w, 1e-6)
    two_step = elementwise.add_rms_norm(x, elementwise.combine(rows, None, k), w, 1e-6)
    assert torch.equal(y, two_step[0])
    assert torch.equal(h, two_step[1])
    y2, h2 = elementwise.add_pairs_rms_norm(x, by_expert, inv, k, w, 1e-6)
    assert torch.equal(y2, y)
    assert torch.equal(h2, h)
    want_y = x.float() + rows.float().view(tokens, k, hidden).sum(dim=1)
    want_h = elementwise.rms_norm_reference(want_y, w.float(), 1e-6)
    # bf16 rounding (half a unit in the last place: at most 2^-8 of a value): of the sum (|sum| < ~5),
    # then of the add; the norm carries y's error and rounds twice more (normed, then * w)
    torch.testing.assert_close(y.float(), want_y, rtol=2**-6, atol=2**-5)
    torch.testing.assert_close(h.float(), want_h, rtol=2**-5, atol=2**-5)


def test_moe_glue_matches_the_argsort_histc_path_cuda() -> None:
    """One full-size MoE layer at 807 tokens: counting sort -> fused experts (pair rows) -> summed into
    the residual add + RMSNorm gives the bits of argsort + histc -> experts_forward -> add_rms_norm."""
    x, old_order, old_counts, top_w, gate_up, down = _case(807, 2048, 768, 128, 8, seed=8)  # argsort, histc
    top_i = _ids_of(old_order, old_counts, 807, 8)
    residual = torch.randn_like(x)
    w = (1.0 + 0.1 * torch.randn_like(x[0])).bfloat16()
    old = moe.experts_forward(x, old_order, old_counts, top_w, gate_up, down)
    want = elementwise.add_rms_norm(residual, old, w, 1e-6)
    order, counts = moe.group_by_expert(top_i, 128)
    pairs = moe.experts_pairs(x, order, counts, top_w, gate_up, down)  # (T k, H)
    got = elementwise.add_pairs_rms_norm(residual, pairs, None, 8, w, 1e-6)
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1], want[1])
