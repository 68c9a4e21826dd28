"""Run by `test_moe.py` in a child process under `TRITON_INTERPRET=1`: the MoE glue kernels (the grouping
of `engine.kernels.moe`, the per-token sums of `engine.kernels.elementwise`) on CPU tensors, through
Triton's interpreter, against plain PyTorch.

- `group_by_expert` / `group_by_expert_inverse` against `torch.argsort(stable=True)` and `torch.bincount`,
  exactly: empty experts, expert counts that are not powers of two, pair counts that are not a multiple
  of the scan block, no pairs at all, int32 (CUDA routing) and int64 (CPU routing) ids.
- `add_pairs_rms_norm`, `combine` and `add_rms_norm` (one kernel) against `x + sum_pairs_reference`
  and `rms_norm_reference`, in pair order and through the inverse index.
- A graph bucket's padding (`valid`): `route_topk` gives its tokens id E and weight 0 and the other
  tokens their unmasked bits; `group_by_expert` leaves those pairs out (the counting sort and the radix
  sort above `COUNTING_SORT_MAX_PAIRS`); the sums give the real tokens their unmasked bits, add 0 to
  the padding's residual and never read its rows (they hold NaN here).

Prints one line per case, `case <kind> <args> ...`, and exits 1 when a case fails.
"""

from __future__ import annotations

import os
import sys

import torch

from engine.kernels import elementwise, fp8, moe

# (tokens, k, experts, scan block, id dtype)
GROUPINGS = (
    (7, 2, 4, 64, torch.int64),  # fewer pairs than one block
    (33, 3, 5, 16, torch.int64),  # 99 pairs: 6 full blocks and a partial one; 5 experts
    (50, 2, 8, 32, torch.int32),  # expert 0 empty, expert 1 in nearly every token
    (0, 2, 4, 64, torch.int32),  # no pairs
    (1, 8, 128, moe.GROUP_BLOCK, torch.int32),  # one token: 120 of 128 experts empty
    (
        700,
        8,
        128,
        moe.GROUP_BLOCK,
        torch.int32,
    ),  # 5,600 pairs: a full default block and a partial one
    (41, 4, 6, 8, torch.int64),  # ids drawn with repeats, experts 2 and 5 never drawn
)


def grouping_case(t: int, k: int, experts: int, block: int, dtype: torch.dtype, gen: torch.Generator) -> bool:
    if experts == 6:  # ids with repeats from a subset of the experts
        top_i = torch.tensor([0, 1, 3, 4], dtype=dtype)[torch.randint(0, 4, (t, k), generator=gen)]
    else:  # distinct experts per token, as top-k routing picks them, from skewed logits
        logits = torch.randn(t, experts, generator=gen)
        logits[:, 0] = -1e9
        logits[:, 1] += 3.0
        top_i = torch.topk(logits, k, dim=-1).indices.to(dtype)  # (T, k)
    flat = top_i.reshape(-1)
    want_order = torch.argsort(flat, stable=True)
    want_counts = torch.bincount(flat.long(), minlength=experts)
    order, counts = moe.group_by_expert(top_i, experts, block=block)
    order2, ends, inv = moe.group_by_expert_inverse(top_i, experts, block=block)
    ok = (
        order.dtype == counts.dtype == ends.dtype == inv.dtype == torch.int32
        and torch.equal(order.long(), want_order)
        and torch.equal(counts.long(), want_counts)
        and torch.equal(order2, order)
        and torch.equal(ends.long(), torch.cumsum(want_counts, 0))
        and torch.equal(order.long()[inv.long()], torch.arange(flat.numel()))
    )
    empty = int((want_counts == 0).sum())
    args = (t, k, experts, block, str(dtype))
    print(f"case group {args} pairs {flat.numel()} empty_experts {empty} exact {ok}")
    return ok


# (tokens, hidden, k, dtype)
SUMS = (
    (5, 64, 8, torch.float32),
    (9, 48, 3, torch.float32),
    (6, 128, 2, torch.bfloat16),
    (0, 64, 2, torch.float32),
)


def sums_case(t: int, hidden: int, k: int, dtype: torch.dtype, gen: torch.Generator) -> bool:
    eps = 1e-6
    x = torch.randn(t, hidden, generator=gen).to(dtype)
    weight = (1.0 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    pairs = torch.randn(t * k, hidden, generator=gen).to(dtype)  # (T k, H) pair order
    perm = torch.randperm(t * k, generator=gen)
    by_expert = torch.empty_like(pairs)
    by_expert[perm] = pairs  # (S, H): pair p sits in row perm[p]
    inv = perm.to(torch.int32)
    want_d = elementwise.sum_pairs_reference(pairs, None, k)  # (T, H)
    want_y = x + want_d
    want_n = elementwise.rms_norm_reference(want_y, weight, eps)
    # Differences relative to each result's largest value. float32: the order of the float32 sums and
    # the norm statistics. bf16: the interpreter rounds float32 to bf16 towards zero (the GPU to
    # nearest), so a sum can be one unit in the last place off (2^-8 to 2^-7 of it), and the norm
    # rounds twice more (normed, then * w).
    tol = 1e-6 if dtype == torch.float32 else 2.0**-5
    worst = worst_rel = 0.0
    for got, want in (
        (elementwise.combine(pairs, None, k), want_d),
        (elementwise.combine(by_expert, inv, k), want_d),
        *zip(elementwise.add_pairs_rms_norm(x, pairs, None, k, weight, eps), (want_y, want_n), strict=True),
        *zip(
            elementwise.add_pairs_rms_norm(x, by_expert, inv, k, weight, eps), (want_y, want_n), strict=True
        ),
        *zip(elementwise.add_rms_norm(x, want_d, weight, eps), (want_y, want_n), strict=True),
    ):
        assert got.shape == want.shape
        assert got.dtype == want.dtype
        if got.numel():
            diff = (got.float() - want.float()).abs()
            worst = max(worst, float(diff.max()))
            worst_rel = max(worst_rel, float(diff.max() / want.float().abs().max()))
    print(f"case sums {(t, hidden, k, str(dtype))} max_abs_diff {worst:.3e} of_scale {worst_rel:.3e}")
    return worst_rel <= tol


# (tokens, hidden, k, dtype)
QUANTS = (
    (7, 64, 4, torch.bfloat16),
    (5, 48, 2, torch.float32),
    (0, 64, 2, torch.bfloat16),
)


def quant_case(t: int, hidden: int, k: int, dtype: torch.dtype, gen: torch.Generator) -> bool:
    # The norms that quantise their output in the same pass give the bits of the norm alone followed
    # by the row quantisation kernel (`fp8._quantize_rows_triton`, the one a CUDA `quantize_rows` runs).
    eps = 1e-6
    x = torch.randn(t, hidden, generator=gen).to(dtype)
    weight = (1.0 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    pairs = (3.0 * torch.randn(t * k, hidden, generator=gen)).to(dtype)  # (T k, H) pair order
    delta = torch.randn(t, hidden, generator=gen).to(dtype)
    ok = True
    for fused, alone in (
        (
            elementwise.add_rms_norm_fp8(x, delta, weight, eps),
            elementwise.add_rms_norm(x, delta, weight, eps),
        ),
        (
            elementwise.add_pairs_rms_norm_fp8(x, pairs, None, k, weight, eps),
            elementwise.add_pairs_rms_norm(x, pairs, None, k, weight, eps),
        ),
    ):
        y, n, (q, qs) = fused
        want_q, want_s = fp8._quantize_rows_triton(alone[1])
        ok = ok and torch.equal(y, alone[0]) and torch.equal(n, alone[1])
        ok = ok and q.dtype == fp8.FP8 and q.shape == (t, hidden) and qs.shape == (t,)
        ok = ok and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(qs, want_s)
    # the same sum without the bf16 normed rows: the same residual and e4m3 bits
    y, n, (q, qs) = elementwise.add_pairs_rms_norm_fp8(x, pairs, None, k, weight, eps)
    y2, n2, (q2, qs2) = elementwise.add_pairs_rms_norm_fp8(x, pairs, None, k, weight, eps, keep_normed=False)
    ok = ok and n2 is None and torch.equal(y2, y) and torch.equal(q2.view(torch.uint8), q.view(torch.uint8))
    ok = ok and torch.equal(qs2, qs)
    print(f"case quant {(t, hidden, k, str(dtype))} bit_equal {ok}")
    return ok


# (tokens, records' tokens in front of the padding, experts, k): a partial routing block of padding, no
# padding, all padding, and more pairs than the counting sort takes (the radix sort's path)
PADDINGS = (
    (37, 29, 8, 2),
    (16, 16, 5, 3),
    (12, 0, 4, 2),
    (4200, 4000, 128, 8),
)


def padding_case(t: int, v: int, experts: int, k: int, gen: torch.Generator) -> bool:
    case = (t, v, experts, k)
    valid = torch.tensor([v], dtype=torch.int32)
    logits = torch.randn(t, experts, generator=gen)
    want_w, want_i = moe.route_topk(logits, k, True)
    top_w, top_i = moe.route_topk(logits, k, True, valid)
    ok = torch.equal(top_w[:v], want_w[:v]) and torch.equal(top_i[:v], want_i[:v])
    ok = ok and bool((top_i[v:] == experts).all()) and bool((top_w[v:] == 0).all())
    order, counts = moe.group_by_expert(top_i, experts)
    real = top_i[:v].reshape(-1)
    n = real.numel()
    ok = ok and torch.equal(counts.long(), torch.bincount(real.long(), minlength=experts))
    ok = ok and torch.equal(order[:n].long(), torch.argsort(real, stable=True))
    # the sums over the tokens around the padding's start (one program a token: the interpreter is slow)
    t, v = min(t, v + 16) - max(0, v - 16), v - max(0, v - 16)
    valid = torch.tensor([v], dtype=torch.int32)
    hidden, eps = 32, 1e-6
    x = torch.randn(t, hidden, generator=gen).to(torch.bfloat16)
    weight = (1.0 + 0.1 * torch.randn(hidden, generator=gen)).to(torch.bfloat16)
    rows = torch.randn(t * k, hidden, generator=gen).to(torch.bfloat16)  # (T k, H) pair order
    masked = rows.clone()
    masked[v * k :] = float("nan")  # rows no expert wrote: never read
    y, nrm, (q, qs) = elementwise.add_pairs_rms_norm_fp8(x, masked, None, k, weight, eps, valid=valid)
    want_y, want_n, (want_q, want_s) = elementwise.add_pairs_rms_norm_fp8(x, rows, None, k, weight, eps)
    pad_y, pad_n = elementwise.add_rms_norm(x[v:], torch.zeros_like(x[v:]), weight, eps)
    ok = ok and torch.equal(y[:v], want_y[:v]) and nrm is not None and torch.equal(nrm[:v], want_n[:v])
    ok = (
        ok
        and torch.equal(q[:v].view(torch.uint8), want_q[:v].view(torch.uint8))
        and torch.equal(qs[:v], want_s[:v])
    )
    ok = ok and torch.equal(y[v:], pad_y) and torch.equal(nrm[v:], pad_n)
    y2, n2 = elementwise.add_pairs_rms_norm(x, masked, None, k, weight, eps, valid)
    ok = ok and torch.equal(y2, y) and torch.equal(n2, nrm)
    print(f"case padding {case} pairs {case[0] * k} grouped {int(counts.sum())} exact {ok}")
    return ok


def main() -> int:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1"
    gen = torch.Generator().manual_seed(0)
    failed = sum(not grouping_case(*case, gen) for case in GROUPINGS)
    failed += sum(not sums_case(*case, gen) for case in SUMS)
    failed += sum(not quant_case(*case, gen) for case in QUANTS)
    failed += sum(not padding_case(*case, gen) for case in PADDINGS)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
