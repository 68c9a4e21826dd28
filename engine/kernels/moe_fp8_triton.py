"""Triton kernels of the FP8 expert block: the two fused expert GEMMs on e4m3 operands; the typed launcher
and the plain-PyTorch twin live in `engine.kernels.moe_fp8`.

They read the grouping as the bf16 kernels do (`engine.kernels.moe_triton`: `order` (S,) pairs sorted by
expert, `counts` (E,), a static grid over an upper bound of the row tiles) and share their prologue.
Scales, all float32:

    gate/up: x (T, H) e4m3 with one scale per token, W (E, 2I, H) e4m3 (gate and up rows interleaved,
             `engine.kernels.fp8.Fp8Experts`) with one scale per expert and output channel;
             acc * x_scale[tok] * w_scale[e, n], SwiGLU and routing weight in float32, then quantised
             again per row and per `group` columns: (S, I) e4m3 + (S, I / group) scales.
    down:    per `group`-wide k step one tensor-core product, scaled by its rows' group scales and summed
             in float32; the sum times w_scale[e, n] is stored in bf16 at the pair's place (token * k + j).

Every scale belongs to one row (or one channel of the weights), so a row's result depends only on its
own input and its expert's weights: batch invariance holds as in bf16. The weights come through TMA
descriptors when `tma` is set, else through pointer loads. Triton's JIT reads kernel arguments without
Python annotations, so this module alone is checked without `disallow_untyped_defs` (pyproject.toml).
"""

import triton
import triton.language as tl

from engine.kernels.moe_triton import _tile_of_program, _tile_pairs


@triton.jit
def _moe_gate_up_fp8_kernel(
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
    # q[r, n] = e4m3(silu(g) * u * routing weight / s[r, n // group]) for the sorted pair r of expert e,
    # g = x[tok(r)] . W[e, 2 n], u = x[tok(r)] . W[e, 2 n + 1] (dequantised, in float32);
    # s = amax over the group's columns / fp8_max. `w` is W (E, 2 inter, hidden) e4m3 with gate and up
    # rows interleaved (`Fp8Experts`): a descriptor in (1, 2 block_n, block_k) boxes with `tma`, else the
    # tensor. A k step is one product of width 2 block_n (the activation tile read once); the
    # accumulator's (gate, up) column pairs sit in one thread, so splitting them moves no data.
    expert, pid_n, row0, row_end = _tile_of_program(counts_ptr, inter // block_n, block_m, e, e_pad)
    if expert >= e:
        return
    rows, rmask, pair = _tile_pairs(order_ptr, row0, row_end, block_m)
    tok = pair // top_k
    ks = tl.arange(0, block_k)
    n0 = pid_n * block_n
    cols = 2 * n0 + tl.arange(0, 2 * block_n)  # (2BN,) interleaved weight rows
    a_ptrs = x_ptr + tok[:, None] * hidden + ks[None, :]  # (BM, BK)
    w_offs = expert.to(tl.int64) * (2 * inter * hidden) + cols[:, None] * hidden + ks[None, :]  # (2BN, BK)
    acc = tl.zeros([block_m, 2 * block_n], dtype=tl.float32)
    for kk in tl.range(0, hidden, block_k, num_stages=stages):
        a = tl.load(a_ptrs + kk, mask=rmask[:, None], other=0.0)
        if tma:  # noqa: SIM108 - a constexpr branch, resolved when Triton compiles
            wt = w.load([expert, 2 * n0, kk]).reshape(2 * block_n, block_k)
        else:
            wt = tl.load(w + w_offs + kk)
        acc = tl.dot(a, wt.T, acc)
    x_scale = tl.load(xs_ptr + tok, mask=rmask, other=0.0)  # (BM,)
    w_scale = tl.load(ws_ptr + expert.to(tl.int64) * (2 * inter) + cols)  # (2BN,)
    # float32 through SwiGLU: nothing is rounded before the e4m3 quantisation
    gf, uf = tl.split(tl.reshape(acc * x_scale[:, None] * w_scale[None, :], (block_m, block_n, 2)))
    _store_swiglu_fp8(gf, uf, topw_ptr, q_ptr, qs_ptr, rows, rmask, pair, pid_n, inter, group, fp8_max)


@triton.jit
def _store_swiglu_fp8(
    gf, uf, topw_ptr, q_ptr, qs_ptr, rows, rmask, pair, pid_n, inter: tl.constexpr, group: tl.constexpr,
    fp8_max: tl.constexpr,
):  # fmt: skip
    # Gate/up epilogue from the dequantised float32 (BM, BN) gate and up of column tile `pid_n`:
    # silu(g) * u * routing weight, quantised per row and per `group` columns into q (S, inter) e4m3 and
    # qs (S, inter / group) float32, rows in expert order.
    block_m: tl.constexpr = gf.shape[0]
    block_n: tl.constexpr = gf.shape[1]
    rw = tl.load(topw_ptr + pair, mask=rmask, other=0.0).to(tl.float32)
    act = gf / (1.0 + tl.exp(-gf)) * uf * rw[:, None]  # (BM, BN)
    blocks: tl.constexpr = block_n // group
    act3 = tl.reshape(act, (block_m, blocks, group))
    scale = tl.maximum(tl.max(tl.abs(act3), axis=2), 1e-12) / fp8_max  # (BM, blocks)
    q = tl.reshape((act3 / scale[:, :, None]).to(q_ptr.dtype.element_ty), (block_m, block_n))
    r64 = rows.to(tl.int64)
    ns = pid_n * block_n + tl.arange(0, block_n)
    tl.store(q_ptr + r64[:, None] * inter + ns[None, :], q, mask=rmask[:, None])
    gs = pid_n * blocks + tl.arange(0, blocks)
    tl.store(qs_ptr + r64[:, None] * (inter // group) + gs[None, :], scale, mask=rmask[:, None])


@triton.jit
def _moe_down_fp8_kernel(
    a,
    as_ptr,
    w,
    ws_ptr,
    order_ptr,
    counts_ptr,
    out_ptr,
    hidden: tl.constexpr,
    inter: tl.constexpr,
    e: tl.constexpr,
    e_pad: tl.constexpr,
    group: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    stages: tl.constexpr,
    tma: tl.constexpr,
    scaling: tl.constexpr,
):
    # scaling 0 ("group"): out[pair(r), n] = w_scale[e, n] * sum_g s[r, g] * (q[r, g] . W[e, n, g]) for
    # the sorted pair r of expert e, one tensor-core product per group g of columns; q (S, inter) e4m3
    # sorted, s (S, inter / group), W (E, hidden, inter) e4m3.
    # scaling 1 ("row_pass"): q was requantised to one scale per row (`_requant_rows_kernel`), s is
    # (S,): out = w_scale[e, n] * s[r] * (q[r] . W[e, n]), the products chained in the accumulator.
    # scaling 2 ("row_fused"): the same requantisation done here, on each loaded group:
    # q' = e4m3(q * (s[r, g] / m[r])), m[r] = max_g s[r, g]; then as 1 with s[r] = m[r].
    # With `tma`, `a` and `w` are descriptors in (block_m, group) and (1, block_n, group) boxes (rows past
    # the expert's end belong to the next expert, or are zero-filled past S, and are never stored).
    expert, pid_n, row0, row_end = _tile_of_program(counts_ptr, hidden // block_n, block_m, e, e_pad)
    if expert >= e:
        return
    rows, rmask, pair = _tile_pairs(order_ptr, row0, row_end, block_m)
    ks = tl.arange(0, group)
    n0 = pid_n * block_n
    ns = n0 + tl.arange(0, block_n)
    r64 = rows.to(tl.int64)
    a_offs = r64[:, None] * inter + ks[None, :]  # (BM, G), pointer loads (no `tma`)
    w_offs = expert.to(tl.int64) * (hidden * inter) + ns[:, None] * inter + ks[None, :]  # (BN, G)
    groups: tl.constexpr = inter // group
    s_ptrs = as_ptr + r64 * (1 if scaling == 1 else groups)
    row_s = tl.load(s_ptrs, mask=rmask, other=0.0)  # (BM,): scaling 1's row scale
    if scaling == 2:
        for gi in tl.range(1, groups):
            row_s = tl.maximum(row_s, tl.load(s_ptrs + gi, mask=rmask, other=0.0))
    row_s = tl.maximum(row_s, 1e-30)  # masked rows: no division by zero below
    acc = tl.zeros([block_m, block_n], dtype=tl.float32)
    for gi in tl.range(0, groups, num_stages=stages):
        if tma:
            at = a.load([row0, gi * group])
            wt = w.load([expert, n0, gi * group]).reshape(block_n, group)
        else:
            at = tl.load(a + a_offs + gi * group, mask=rmask[:, None], other=0.0)
            wt = tl.load(w + w_offs + gi * group)
        if scaling == 0:
            s = tl.load(s_ptrs + gi, mask=rmask, other=0.0)  # (BM,)
            acc += tl.dot(at, wt.T) * s[:, None]
        elif scaling == 1:
            acc = tl.dot(at, wt.T, acc)
        else:
            ratio = tl.load(s_ptrs + gi, mask=rmask, other=0.0) / row_s  # (BM,), <= 1
            at = (at.to(tl.float32) * ratio[:, None]).to(at.dtype)
            acc = tl.dot(at, wt.T, acc)
    if scaling != 0:
        acc = acc * row_s[:, None]
    w_s = tl.load(ws_ptr + expert.to(tl.int64) * hidden + ns)  # (BN,)
    o_ptrs = out_ptr + pair[:, None] * hidden + ns[None, :]
    tl.store(o_ptrs, (acc * w_s[None, :]).to(out_ptr.dtype.element_ty), mask=rmask[:, None])


@triton.jit
def _requant_rows_kernel(
    q_ptr,
    qs_ptr,
    rs_ptr,
    rows,
    inter: tl.constexpr,
    group: tl.constexpr,
    block_r: tl.constexpr,
):
    # In place: q[r, g] = e4m3(q[r, g] * (s[r, g] / m[r])) for every group g of row r, m[r] = max_g s[r, g]
    # stored in rs (S,); q (S, inter) e4m3, s (S, inter / group) float32.
    groups: tl.constexpr = inter // group
    r = tl.program_id(0) * block_r + tl.arange(0, block_r)
    rmask = r < rows
    r64 = r.to(tl.int64)
    cs = tl.arange(0, group)
    m = tl.load(qs_ptr + r64 * groups, mask=rmask, other=0.0)
    for gi in tl.range(1, groups):
        m = tl.maximum(m, tl.load(qs_ptr + r64 * groups + gi, mask=rmask, other=0.0))
    m = tl.maximum(m, 1e-30)
    for gi in tl.range(0, groups):
        ratio = tl.load(qs_ptr + r64 * groups + gi, mask=rmask, other=0.0) / m
        ptrs = q_ptr + r64[:, None] * inter + gi * group + cs[None, :]
        q = tl.load(ptrs, mask=rmask[:, None], other=0.0)
        tl.store(ptrs, (q.to(tl.float32) * ratio[:, None]).to(q_ptr.dtype.element_ty), mask=rmask[:, None])
    tl.store(rs_ptr + r64, m, mask=rmask)
