"""Triton kernels of the MoE block: routing, grouping of the token-expert pairs by expert, and the two fused
expert GEMMs; the typed launchers and the plain-PyTorch twins live in `engine.kernels.moe`.

The expert kernels read the grouping the same way: `order` (S,) lists the token-expert pairs sorted by
expert, `counts` (E,) how many pairs each expert got. Expert e owns ceil(counts[e] / block_m) row tiles;
tile ids run over the experts in order, and the launch grid covers an upper bound of the tile count (a
static shape, so a CUDA graph can capture it): programs past the last tile return at once. Every row of
the result depends only on its own input row and the expert's weights, with a fixed k-loop, so results
are independent of the other records of a batch (batch invariance holds exactly). The pointer-load and
TMA variants of each kernel share their prologue (`_tile_of_program`, `_tile_pairs`) and epilogue
(`_store_swiglu`, `_store_pairs`); only their k-loops differ.

Triton's JIT reads kernel arguments without Python annotations, so this module alone is checked without
`disallow_untyped_defs` (see pyproject.toml); nothing outside `engine.kernels.moe` calls it.
"""

import triton
import triton.language as tl


@triton.jit
def _tile_of_expert(counts_ptr, pid_m, block_m: tl.constexpr, e: tl.constexpr, e_pad: tl.constexpr):
    # (expert, first row of this tile, end row of the expert) for row tile `pid_m`; expert is >= e when
    # the tile is past the last one. The (E,) counts are tiny and stay in L1/L2.
    ex = tl.arange(0, e_pad)
    counts = tl.load(counts_ptr + ex, mask=ex < e, other=0).to(tl.int32)
    tiles = (counts + block_m - 1) // block_m
    tile_end = tl.cumsum(tiles, 0)
    row_end_all = tl.cumsum(counts, 0)
    expert = tl.sum(((tile_end <= pid_m) & (ex < e)).to(tl.int32), 0)
    mine = ex == expert
    first_tile = tl.sum(tl.where(mine, tile_end - tiles, 0), 0)
    row_end = tl.sum(tl.where(mine, row_end_all, 0), 0)
    row_begin = row_end - tl.sum(tl.where(mine, counts, 0), 0)
    return expert, row_begin + (pid_m - first_tile) * block_m, row_end


@triton.jit
def _tile_of_program(
    counts_ptr, num_n: tl.constexpr, block_m: tl.constexpr, e: tl.constexpr, e_pad: tl.constexpr
):
    # (expert, output column tile, first row, end row of the expert) of this program: the grid runs over
    # row tiles (in expert order) x `num_n` column tiles; expert >= e past the last row tile.
    pid = tl.program_id(0)
    expert, row0, row_end = _tile_of_expert(counts_ptr, pid // num_n, block_m, e, e_pad)
    return expert, pid % num_n, row0, row_end


@triton.jit
def _tile_pairs(order_ptr, row0, row_end, block_m: tl.constexpr):
    # The tile's sorted rows (BM,), which of them belong to its expert, and their pair ids (token * k + j).
    rows = row0 + tl.arange(0, block_m)
    rmask = rows < row_end
    pair = tl.load(order_ptr + rows, mask=rmask, other=0).to(tl.int64)
    return rows, rmask, pair


@triton.jit
def _store_swiglu(acc_g, acc_u, topw_ptr, out_ptr, rows, rmask, pair, ns, inter: tl.constexpr):
    # Gate/up epilogue: out[r, n] = silu(g) * u * routing weight for the tile's (BM, BN) float32
    # accumulators, out (S, inter) in expert order.
    # Round the projections to the activation dtype first, as the unfused path (GEMM, then SwiGLU) does.
    g = acc_g.to(out_ptr.dtype.element_ty).to(tl.float32)
    u = acc_u.to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(topw_ptr + pair, mask=rmask, other=0.0).to(tl.float32)
    act = g / (1.0 + tl.exp(-g)) * u * w[:, None]
    o_ptrs = out_ptr + rows.to(tl.int64)[:, None] * inter + ns[None, :]
    tl.store(o_ptrs, act.to(out_ptr.dtype.element_ty), mask=rmask[:, None])


@triton.jit
def _store_pairs(acc, out_ptr, rmask, pair, ns, hidden: tl.constexpr):
    # Down epilogue: the tile's (BM, BN) float32 accumulator to out (S, hidden) in pair order.
    o_ptrs = out_ptr + pair[:, None] * hidden + ns[None, :]
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=rmask[:, None])


@triton.jit
def _moe_gate_up_kernel(
    x_ptr,
    w_ptr,
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
):
    # out[r, n] = silu(g) * u * routing weight, g = x[tok(r)] . W[e, n], u = x[tok(r)] . W[e, inter + n]
    # for the sorted pair r (expert e), x (T, hidden), W (E, 2 inter, hidden), out (S, inter) sorted.
    # The token gather is part of the A load, and SwiGLU is the epilogue: (S, 2 inter) never exists.
    expert, pid_n, row0, row_end = _tile_of_program(counts_ptr, inter // block_n, block_m, e, e_pad)
    if expert >= e:
        return
    rows, rmask, pair = _tile_pairs(order_ptr, row0, row_end, block_m)
    tok = pair // top_k
    ks = tl.arange(0, block_k)
    ns = pid_n * block_n + tl.arange(0, block_n)
    a_ptrs = x_ptr + tok[:, None] * hidden + ks[None, :]  # (BM, BK)
    w_base = w_ptr + expert.to(tl.int64) * (2 * inter * hidden)
    g_ptrs = w_base + ns[None, :] * hidden + ks[:, None]  # (BK, BN)
    u_ptrs = g_ptrs + inter * hidden
    acc_g = tl.zeros([block_m, block_n], dtype=tl.float32)
    acc_u = tl.zeros([block_m, block_n], dtype=tl.float32)
    for _ in range(0, hidden, block_k):
        a = tl.load(a_ptrs, mask=rmask[:, None], other=0.0)
        acc_g = tl.dot(a, tl.load(g_ptrs), acc_g)
        acc_u = tl.dot(a, tl.load(u_ptrs), acc_u)
        a_ptrs += block_k
        g_ptrs += block_k
        u_ptrs += block_k
    _store_swiglu(acc_g, acc_u, topw_ptr, out_ptr, rows, rmask, pair, ns, inter)


@triton.jit
def _moe_down_kernel(
    a_ptr,
    w_ptr,
    order_ptr,
    counts_ptr,
    out_ptr,
    hidden: tl.constexpr,
    inter: tl.constexpr,
    e: tl.constexpr,
    e_pad: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
):
    # out[pair(r), n] = a[r] . W[e, n] for the sorted pair r (expert e), a (S, inter) sorted,
    # W (E, hidden, inter), out (S, hidden) in pair order (token * k + j), so the per-token sum that
    # follows reads k contiguous rows per token and no inverse permutation is needed.
    expert, pid_n, row0, row_end = _tile_of_program(counts_ptr, hidden // block_n, block_m, e, e_pad)
    if expert >= e:
        return
    rows, rmask, pair = _tile_pairs(order_ptr, row0, row_end, block_m)
    ks = tl.arange(0, block_k)
    ns = pid_n * block_n + tl.arange(0, block_n)
    a_ptrs = a_ptr + rows.to(tl.int64)[:, None] * inter + ks[None, :]  # (BM, BK)
    w_base = w_ptr + expert.to(tl.int64) * (hidden * inter)
    w_ptrs = w_base + ns[None, :] * inter + ks[:, None]  # (BK, BN)
    acc = tl.zeros([block_m, block_n], dtype=tl.float32)
    for _ in range(0, inter, block_k):
        a = tl.load(a_ptrs, mask=rmask[:, None], other=0.0)
        acc = tl.dot(a, tl.load(w_ptrs), acc)
        a_ptrs += block_k
        w_ptrs += block_k
    _store_pairs(acc, out_ptr, rmask, pair, ns, hidden)


@triton.jit
def _moe_gate_up_tma_kernel(
    x_ptr,
    w_desc,
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
    ws: tl.constexpr,
):
    # `_moe_gate_up_kernel` with the weight tiles brought in by the tensor-memory accelerator (TMA):
    # `w_desc` describes W (E, 2 inter, hidden) in (1, block_n, block_k) boxes.
    expert, pid_n, row0, row_end = _tile_of_program(counts_ptr, inter // block_n, block_m, e, e_pad)
    if expert >= e:
        return
    rows, rmask, pair = _tile_pairs(order_ptr, row0, row_end, block_m)
    tok = pair // top_k
    ks = tl.arange(0, block_k)
    n0 = pid_n * block_n
    acc_g = tl.zeros([block_m, block_n], dtype=tl.float32)
    acc_u = tl.zeros([block_m, block_n], dtype=tl.float32)
    for kk in tl.range(0, hidden, block_k, num_stages=stages, warp_specialize=ws):
        a = tl.load(x_ptr + tok[:, None] * hidden + kk + ks[None, :], mask=rmask[:, None], other=0.0)
        g = w_desc.load([expert, n0, kk]).reshape(block_n, block_k)
        u = w_desc.load([expert, inter + n0, kk]).reshape(block_n, block_k)
        acc_g = tl.dot(a, g.T, acc_g)
        acc_u = tl.dot(a, u.T, acc_u)
    _store_swiglu(acc_g, acc_u, topw_ptr, out_ptr, rows, rmask, pair, n0 + tl.arange(0, block_n), inter)


@triton.jit
def _moe_down_tma_kernel(
    a_desc,
    w_desc,
    order_ptr,
    counts_ptr,
    out_ptr,
    hidden: tl.constexpr,
    inter: tl.constexpr,
    e: tl.constexpr,
    e_pad: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
    stages: tl.constexpr,
    ws: tl.constexpr,
):
    # `_moe_down_kernel` with both operands brought in by TMA: the tile's rows are contiguous in the
    # expert-sorted activations (`a_desc`, (S, inter) in (block_m, block_k) boxes; rows past the
    # expert's end belong to the next expert or are zero-filled past S, and are never stored) and
    # `w_desc` describes W (E, hidden, inter) in (1, block_n, block_k) boxes.
    expert, pid_n, row0, row_end = _tile_of_program(counts_ptr, hidden // block_n, block_m, e, e_pad)
    if expert >= e:
        return
    _, rmask, pair = _tile_pairs(order_ptr, row0, row_end, block_m)
    n0 = pid_n * block_n
    acc = tl.zeros([block_m, block_n], dtype=tl.float32)
    for kk in tl.range(0, inter, block_k, num_stages=stages, warp_specialize=ws):
        a = a_desc.load([row0, kk])
        w = w_desc.load([expert, n0, kk]).reshape(block_n, block_k)
        acc = tl.dot(a, w.T, acc)
    _store_pairs(acc, out_ptr, rmask, pair, n0 + tl.arange(0, block_n), hidden)


@triton.jit(do_not_specialize=["rows"])  # one compiled kernel whatever the batch size
def _route_topk_kernel(
    logits_ptr,
    w_ptr,
    i_ptr,
    valid_ptr,
    rows,
    e: tl.constexpr,
    e_pad: tl.constexpr,
    k: tl.constexpr,
    k_pad: tl.constexpr,
    normalize: tl.constexpr,
    masked: tl.constexpr,
    block_rows: tl.constexpr,
):
    # One program per `block_rows` tokens: float32 softmax statistics, k rounds of arg-max (lowest index
    # wins a tie), then the chosen probabilities, renormalised over the k when `normalize`. With `masked`,
    # the rows from `valid_ptr[0]` on are padding: ids `e` (past every expert) and weights 0.
    r = tl.program_id(0).to(tl.int64) * block_rows + tl.arange(0, block_rows)[:, None]  # (R, 1)
    c = tl.arange(0, e_pad)[None, :]  # (1, Ep)
    kc = tl.arange(0, k_pad)[None, :]  # (1, kp)
    valid = r < rows
    x = tl.load(logits_ptr + r * e + c, mask=valid & (c < e), other=float("-inf")).to(tl.float32)
    mx = tl.max(x, axis=1)[:, None]  # (R, 1)
    denom = tl.sum(tl.exp(x - mx), axis=1)[:, None]  # (R, 1)
    vals = tl.zeros([block_rows, k_pad], dtype=tl.float32)
    idxs = tl.zeros([block_rows, k_pad], dtype=tl.int32)
    for j in tl.static_range(k):
        best = tl.max(x, axis=1)[:, None]  # (R, 1)
        pick = tl.min(tl.where(x == best, c, e_pad), axis=1)[:, None]  # (R, 1)
        vals = tl.where(kc == j, tl.exp(best - mx), vals)
        idxs = tl.where(kc == j, pick, idxs)
        x = tl.where(c == pick, float("-inf"), x)
    if normalize:  # noqa: SIM108 - a constexpr branch, resolved when Triton compiles
        vals = vals / tl.sum(vals, axis=1)[:, None]
    else:
        vals = vals / denom
    if masked:
        pad = r >= tl.load(valid_ptr)  # (R, 1)
        vals = tl.where(pad, 0.0, vals)
        idxs = tl.where(pad, e, idxs)
    tl.store(w_ptr + r * k + kc, vals, mask=valid & (kc < k))
    tl.store(i_ptr + r * k + kc, idxs, mask=valid & (kc < k))


@triton.jit
def _group_by_expert_kernel(
    ids_ptr,
    order_ptr,
    inv_ptr,
    counts_ptr,
    ends_ptr,
    pairs,
    e: tl.constexpr,
    block: tl.constexpr,
    inverse: tl.constexpr,
):
    # A counting sort of the S = `pairs` expert ids, one program per expert `ex`: pass 1 counts the ids
    # below ex (where its pairs start in `order`) and equal to it; pass 2 writes the ids of its pairs at
    # start + their running rank, in ascending pair id (a stable sort), and with `inverse` each pair's
    # slot in `inv`. Every program reads all S ids (4 S bytes, L2-resident) twice; the grid is (E,)
    # whatever S, so a CUDA graph can capture it.
    ex = tl.program_id(0)
    offs = tl.arange(0, block)
    below = tl.zeros([block], dtype=tl.int32)
    mine = tl.zeros([block], dtype=tl.int32)
    # `while`, not `range`, over the runtime pair count: Triton's interpreter cannot take a runtime
    # scalar as a `range` bound (tests run this kernel under it).
    b = 0
    while b < pairs:
        p = b + offs
        key = tl.load(ids_ptr + p, mask=p < pairs, other=e)  # padding: an id past every expert
        below += (key < ex).to(tl.int32)
        mine += (key == ex).to(tl.int32)
        b += block
    start = tl.sum(below, axis=0)
    count = tl.sum(mine, axis=0)
    tl.store(counts_ptr + ex, count)
    tl.store(ends_ptr + ex, start + count)
    placed = start
    b = 0
    while b < pairs:
        p = b + offs
        hit = tl.load(ids_ptr + p, mask=p < pairs, other=e) == ex
        hits = hit.to(tl.int32)
        slot = placed + tl.cumsum(hits, axis=0) - 1  # (block,) inclusive running rank
        tl.store(order_ptr + slot, p, mask=hit)
        if inverse:
            tl.store(inv_ptr + p, slot, mask=hit)
        placed += tl.sum(hits, axis=0)
        b += block
