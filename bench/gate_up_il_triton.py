"""Bench-only Triton kernels (not imported by the product) for `bench.gate_up_il`: the bf16 gate/up expert
GEMM of `engine.kernels.moe_triton` on an interleaved weight layout, and the e4m3 gate/up GEMM as
`engine.kernels.moe_fp8_triton` ran it before it moved to that layout.

Interleaved layout: W_il (E, 2 I, H) with W_il[e, 2 n] = W_gate[e, n] and W_il[e, 2 n + 1] = W_up[e, n].
A program's `block_n` output columns then need one contiguous (2 block_n, block_k) weight tile per k step
and one tensor-core product of width 2 block_n, instead of two products of width block_n that each read
the same activation tile; the accumulator's column pairs (gate, up) sit in the same thread, so splitting
them for SwiGLU moves no data. Everything else (prologue, gather, epilogue) is the shipped kernels'.

Triton's JIT reads kernel arguments without Python annotations; this module is bench code only.
"""

import triton
import triton.language as tl

from engine.kernels.moe_fp8_triton import _store_swiglu_fp8
from engine.kernels.moe_triton import _store_swiglu, _tile_of_program, _tile_pairs


@triton.jit
def _split_pairs(acc, block_m: tl.constexpr, block_n: tl.constexpr):
    # (BM, 2 BN) accumulator with gate/up column pairs -> gate (BM, BN), up (BM, BN).
    return tl.split(tl.reshape(acc, (block_m, block_n, 2)))


@triton.jit
def _gate_up_il_kernel(
    x_ptr,
    w,
    order_ptr,
    counts_ptr,
    topw_ptr,
    out_ptr,
    hidden: tl.constexpr,
    inter: tl.constexpr,
    e: tl.constexpr,
    e_pad: tl.constexpr,
    top_k: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
    stages: tl.constexpr,
    tma: tl.constexpr,
):
    # `_moe_gate_up_kernel` / `_moe_gate_up_tma_kernel` on W_il: `w` a descriptor in (1, 2 block_n,
    # block_k) boxes with `tma`, else the tensor.
    expert, pid_n, row0, row_end = _tile_of_program(counts_ptr, inter // block_n, block_m, e, e_pad)
    if expert >= e:
        return
    rows, rmask, pair = _tile_pairs(order_ptr, row0, row_end, block_m)
    tok = pair // top_k
    ks = tl.arange(0, block_k)
    n0 = pid_n * block_n
    cols = 2 * n0 + tl.arange(0, 2 * block_n)
    w_offs = expert.to(tl.int64) * (2 * inter * hidden) + cols[:, None] * hidden + ks[None, :]  # (2BN, BK)
    acc = tl.zeros([block_m, 2 * block_n], dtype=tl.float32)
    for kk in tl.range(0, hidden, block_k, num_stages=stages):
        a = tl.load(x_ptr + tok[:, None] * hidden + kk + ks[None, :], mask=rmask[:, None], other=0.0)
        if tma:  # noqa: SIM108 - a constexpr branch, resolved when Triton compiles
            wt = w.load([expert, 2 * n0, kk]).reshape(2 * block_n, block_k)
        else:
            wt = tl.load(w + w_offs + kk)
        acc = tl.dot(a, wt.T, acc)
    acc_g, acc_u = _split_pairs(acc, block_m, block_n)
    _store_swiglu(acc_g, acc_u, topw_ptr, out_ptr, rows, rmask, pair, n0 + tl.arange(0, block_n), inter)


@triton.jit
def _gate_up_halves_fp8_kernel(
    x_ptr,
    xs_ptr,
    w,
    ws_ptr,
    order_ptr,
    counts_ptr,
    topw_ptr,
    q_ptr,
    qs_ptr,
    hidden: tl.constexpr,
    inter: tl.constexpr,
    e: tl.constexpr,
    e_pad: tl.constexpr,
    top_k: tl.constexpr,
    group: tl.constexpr,
    fp8_max: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
    stages: tl.constexpr,
    tma: tl.constexpr,
):
    # The e4m3 gate/up kernel before the interleaved layout (gate rows first, then up rows; two products
    # of width block_n per k step), kept for `bench.gate_up_il`'s comparison.
    # q[r, n] = e4m3(silu(g) * u * routing weight / s[r, n // group]) for the sorted pair r of expert e,
    # g = x[tok(r)] . W[e, n], u = x[tok(r)] . W[e, inter + n] (dequantised, in float32);
    # s = amax over the group's columns / fp8_max. `w` is W (E, 2 inter, hidden) e4m3: a descriptor in
    # (1, block_n, block_k) boxes with `tma`, else the tensor.
    expert, pid_n, row0, row_end = _tile_of_program(counts_ptr, inter // block_n, block_m, e, e_pad)
    if expert >= e:
        return
    rows, rmask, pair = _tile_pairs(order_ptr, row0, row_end, block_m)
    tok = pair // top_k
    ks = tl.arange(0, block_k)
    n0 = pid_n * block_n
    ns = n0 + tl.arange(0, block_n)
    a_ptrs = x_ptr + tok[:, None] * hidden + ks[None, :]  # (BM, BK)
    g_offs = expert.to(tl.int64) * (2 * inter * hidden) + ns[:, None] * hidden + ks[None, :]  # (BN, BK)
    acc_g = tl.zeros([block_m, block_n], dtype=tl.float32)
    acc_u = tl.zeros([block_m, block_n], dtype=tl.float32)
    for kk in tl.range(0, hidden, block_k, num_stages=stages):
        a = tl.load(a_ptrs + kk, mask=rmask[:, None], other=0.0)
        if tma:
            g = w.load([expert, n0, kk]).reshape(block_n, block_k)
            u = w.load([expert, inter + n0, kk]).reshape(block_n, block_k)
        else:
            g = tl.load(w + g_offs + kk)
            u = tl.load(w + g_offs + inter * hidden + kk)
        acc_g = tl.dot(a, g.T, acc_g)
        acc_u = tl.dot(a, u.T, acc_u)
    x_scale = tl.load(xs_ptr + tok, mask=rmask, other=0.0)  # (BM,)
    w_scale = ws_ptr + expert.to(tl.int64) * (2 * inter)
    g_s = tl.load(w_scale + ns)  # (BN,)
    u_s = tl.load(w_scale + inter + ns)
    gf = acc_g * x_scale[:, None] * g_s[None, :]  # float32 through SwiGLU: nothing is rounded before
    uf = acc_u * x_scale[:, None] * u_s[None, :]  # the e4m3 quantisation
    _store_swiglu_fp8(gf, uf, topw_ptr, q_ptr, qs_ptr, rows, rmask, pair, pid_n, inter, group, fp8_max)
