"""Triton kernels of the fused elementwise ops; the typed launchers and PyTorch twins live in
`engine.kernels.elementwise`.

Triton's JIT reads kernel arguments without Python annotations, so this module alone is checked
without `disallow_untyped_defs` (see pyproject.toml); nothing outside `engine.kernels.elementwise` calls it.
"""

import triton
import triton.language as tl


@triton.jit
def _pair_row(rows_ptr, inv_ptr, pair, cols, mask, hidden: tl.constexpr, indexed: tl.constexpr):
    # Row `pair` (token * k + j) of the expert outputs in float32: rows[inv[pair]] when `indexed`. Columns
    # outside `mask` read 0.
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
    q_ptr,
    qs_ptr,
    valid_ptr,
    eps,
    hidden: tl.constexpr,
    k: tl.constexpr,
    block: tl.constexpr,
    indexed: tl.constexpr,
    residual: tl.constexpr,
    quant: tl.constexpr,
    store_normed: tl.constexpr,
    masked: tl.constexpr,
    fp8_max: tl.constexpr,
):
    # One program per token t: d = sum_j rows[r_j] in float32, in j order, with r_j = inv[t k + j] when
    # `indexed` (rows in expert order) or t k + j (pair order; k = 1: a plain (T, H) delta), rounded to
    # the rows' dtype as a separate sum kernel would store it. With `residual`: y = x + d and
    # n = RMSNorm(y) * w (`x_ptr`, `w_ptr`, `n_ptr` are unused without it); else y = d. With `quant` too,
    # n's row quantised to e4m3 as `_row_quant_fp8_kernel` does it: q = n / s, s = amax(|n|) / fp8_max.
    # Without `store_normed` (with `residual` only) n is computed but not stored (`n_ptr` unused). With
    # `masked` (pair order only), the tokens from `valid_ptr[0]` on are padding: d is 0 and their rows,
    # which no expert wrote, are not read.
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, block)
    mask = cols < hidden
    read = mask
    if masked:
        read = mask & (t < tl.load(valid_ptr))
    # The first row starts the sum (no 0 + d: with k = 1 this is exactly a plain residual add).
    acc = _pair_row(rows_ptr, inv_ptr, t * k, cols, read, hidden, indexed)
    for j in tl.static_range(1, k):
        acc += _pair_row(rows_ptr, inv_ptr, t * k + j, cols, read, hidden, indexed)
    d = acc.to(rows_ptr.dtype.element_ty)
    base = t * hidden
    if residual:
        x = tl.load(x_ptr + base + cols, mask=mask, other=0.0)
        y = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
        tl.store(y_ptr + base + cols, y, mask=mask)
        yf = y.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(yf * yf, axis=0) / hidden + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        normed = ((yf * rstd).to(x.dtype).to(tl.float32) * w.to(tl.float32)).to(x.dtype)
        if store_normed:
            tl.store(n_ptr + base + cols, normed, mask=mask)
        if quant:
            nf = normed.to(tl.float32)
            scale = tl.maximum(tl.max(tl.abs(nf), axis=0), 1e-12) / fp8_max
            tl.store(q_ptr + base + cols, (nf / scale).to(q_ptr.dtype.element_ty), mask=mask)
            tl.store(qs_ptr + t, scale)
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
