"""Triton kernels of the GPU fast path; typed wrappers and PyTorch twins live in `engine.kernels.elementwise`.

Triton's JIT reads kernel arguments without Python annotations, so this module alone is checked
without `disallow_untyped_defs` (see pyproject.toml); nothing outside `engine.kernels.elementwise` calls it.
"""

import triton
import triton.language as tl


@triton.jit
def _pair_row(rows_ptr, inv_ptr, pair, cols, mask, hidden: tl.constexpr, indexed: tl.constexpr):
    # Row `pair` (token * k + j) of the expert outputs in float32: rows[inv[pair]] when `indexed`.
    if indexed:  # noqa: SIM108 - a constexpr branch, resolved when Triton compiles
        src = tl.load(inv_ptr + pair).to(tl.int64)
    else:
        src = pair
    return tl.load(rows_ptr + src * hidden + cols, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _sum_rows_kernel(
    rows_ptr,
    inv_ptr,
    x_ptr,
    w_ptr,
    y_ptr,
    n_ptr,
    eps,
    hidden: tl.constexpr,
    k: tl.constexpr,
    block: tl.constexpr,
    indexed: tl.constexpr,
    residual: tl.constexpr,
):
    # One program per token t: d = sum_j rows[r_j] in float32, in j order, with r_j = inv[t k + j] when
    # `indexed` (rows in expert order) or t k + j (pair order; k = 1: a plain (T, H) delta), rounded to
    # the rows' dtype as a separate sum kernel would store it. With `residual`: y = x + d and
    # n = RMSNorm(y) * w (`x_ptr`, `w_ptr`, `n_ptr` are unused without it); else y = d.
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, block)
    mask = cols < hidden
    # The first row starts the sum (no 0 + d: with k = 1 this is exactly a plain residual add).
    acc = _pair_row(rows_ptr, inv_ptr, t * k, cols, mask, hidden, indexed)
    for j in tl.static_range(1, k):
        acc += _pair_row(rows_ptr, inv_ptr, t * k + j, cols, mask, hidden, indexed)
    d = acc.to(rows_ptr.dtype.element_ty)
    base = t * hidden
    if residual:
        x = tl.load(x_ptr + base + cols, mask=mask, other=0.0)
        y = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
        tl.store(y_ptr + base + cols, y, mask=mask)
        yf = y.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(yf * yf, axis=0) / hidden + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        normed = (yf * rstd).to(x.dtype).to(tl.float32) * w.to(tl.float32)
        tl.store(n_ptr + base + cols, normed.to(x.dtype), mask=mask)
    else:
        tl.store(y_ptr + base + cols, d, mask=mask)


@triton.jit
def _swiglu_kernel(
    h_ptr,
    w_ptr,
    out_ptr,
    total,
    inter: tl.constexpr,
    block: tl.constexpr,
):
    idx = tl.program_id(0).to(tl.int64) * block + tl.arange(0, block)
    mask = idx < total
    s = idx // inter
    i = idx % inter
    g = tl.load(h_ptr + s * (2 * inter) + i, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(h_ptr + s * (2 * inter) + inter + i, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + s, mask=mask, other=0.0).to(tl.float32)
    a = g / (1.0 + tl.exp(-g)) * u * w
    tl.store(out_ptr + idx, a.to(out_ptr.dtype.element_ty), mask=mask)


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


@triton.jit
def _qk_norm_rope_kernel(
    qkv_ptr,
    qw_ptr,
    kw_ptr,
    cos_ptr,
    sin_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    eps,
    hq: tl.constexpr,
    hk: tl.constexpr,
    d: tl.constexpr,
    heads_pad: tl.constexpr,
):
    # One program per token: all its q, k and v heads as a (heads, d/2) tile, both rotary halves at once.
    # q and k are normalised and rotated, v is copied out of the fused projection.
    t = tl.program_id(0).to(tl.int64)
    half: tl.constexpr = d // 2
    heads = tl.arange(0, heads_pad)[:, None]  # (Hp, 1)
    cols = tl.arange(0, half)[None, :]  # (1, half)
    mask = (heads < hq + 2 * hk) & (cols < half)  # (Hp, half)
    row = qkv_ptr + t * ((hq + 2 * hk) * d) + heads * d
    x1 = tl.load(row + cols, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(row + half + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / d + eps)  # (Hp,)
    rstd2 = rstd[:, None]  # (Hp, 1)
    is_q = heads < hq  # (Hp, 1)
    is_v = heads >= hq + hk  # (Hp, 1)
    w1 = tl.where(is_q, tl.load(qw_ptr + cols).to(tl.float32), tl.load(kw_ptr + cols).to(tl.float32))
    w2 = tl.where(
        is_q, tl.load(qw_ptr + half + cols).to(tl.float32), tl.load(kw_ptr + half + cols).to(tl.float32)
    )
    # Round the normalised values to the activation dtype before scaling, as the reference does.
    n1 = ((x1 * rstd2).to(q_ptr.dtype.element_ty).to(tl.float32) * w1).to(q_ptr.dtype.element_ty)
    n2 = ((x2 * rstd2).to(q_ptr.dtype.element_ty).to(tl.float32) * w2).to(q_ptr.dtype.element_ty)
    n1 = n1.to(tl.float32)
    n2 = n2.to(tl.float32)
    c1 = tl.load(cos_ptr + t * d + cols).to(tl.float32)  # (1, half)
    c2 = tl.load(cos_ptr + t * d + half + cols).to(tl.float32)
    s1 = tl.load(sin_ptr + t * d + cols).to(tl.float32)
    s2 = tl.load(sin_ptr + t * d + half + cols).to(tl.float32)
    o1 = tl.where(is_v, x1, n1 * c1 - n2 * s1).to(q_ptr.dtype.element_ty)
    o2 = tl.where(is_v, x2, n2 * c2 + n1 * s2).to(q_ptr.dtype.element_ty)
    q_mask = mask & is_q
    q_out = q_ptr + t * (hq * d) + heads * d
    tl.store(q_out + cols, o1, mask=q_mask)
    tl.store(q_out + half + cols, o2, mask=q_mask)
    k_mask = mask & (heads >= hq) & (heads < hq + hk)
    k_out = k_ptr + t * (hk * d) + (heads - hq) * d
    tl.store(k_out + cols, o1, mask=k_mask)
    tl.store(k_out + half + cols, o2, mask=k_mask)
    v_mask = mask & is_v
    v_out = v_ptr + t * (hk * d) + (heads - hq - hk) * d
    tl.store(v_out + cols, o1, mask=v_mask)
    tl.store(v_out + half + cols, o2, mask=v_mask)


@triton.jit(do_not_specialize=["rows"])  # one compiled kernel whatever the batch size
def _route_topk_kernel(
    logits_ptr,
    w_ptr,
    i_ptr,
    rows,
    e: tl.constexpr,
    e_pad: tl.constexpr,
    k: tl.constexpr,
    k_pad: tl.constexpr,
    normalize: tl.constexpr,
    block_rows: tl.constexpr,
):
    # One program per `block_rows` tokens: float32 softmax statistics, k rounds of arg-max (lowest index
    # wins a tie), then the chosen probabilities, renormalised over the k when `normalize`.
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
    tl.store(w_ptr + r * k + kc, vals, mask=valid & (kc < k))
    tl.store(i_ptr + r * k + kc, idxs, mask=valid & (kc < k))


@triton.jit
def _row_quant_fp8_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    n: tl.constexpr,
    block: tl.constexpr,
    fp8_max: tl.constexpr,
):
    # One program per row: amax, scale = amax / fp8_max, q = x / scale rounded to e4m3.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, block)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / fp8_max
    tl.store(q_ptr + row * n + cols, (x / scale).to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row, scale)


@triton.jit
def _swiglu_fp8_kernel(
    h_ptr,
    w_ptr,
    q_ptr,
    s_ptr,
    inter: tl.constexpr,
    block: tl.constexpr,
    fp8_max: tl.constexpr,
):
    # One program per token-expert row: a = silu(gate) * up * routing weight in float32, then the row's
    # e4m3 quantisation (as `_row_quant_fp8_kernel`), so the down projection reads 1 byte per value.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, block)
    mask = cols < inter
    g = tl.load(h_ptr + row * (2 * inter) + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(h_ptr + row * (2 * inter) + inter + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + row).to(tl.float32)
    a = g / (1.0 + tl.exp(-g)) * u * w
    scale = tl.maximum(tl.max(tl.abs(a), axis=0), 1e-12) / fp8_max
    tl.store(q_ptr + row * inter + cols, (a / scale).to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row, scale)
