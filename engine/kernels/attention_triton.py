"""Triton kernel of the packed causal attention (`engine.kernels.attention` holds the typed wrapper and the
PyTorch twin).

One program computes one block of `block_m` query rows of one record, streaming that
record's keys and values in blocks of `block_n` with an online softmax (running row maximum and sum in
float32, probabilities rounded to the value dtype for the second product, as FlashAttention does). The
key blocks wholly before the query block need no mask; the blocks on the diagonal are masked causally
and at the record's end. Grouped-query attention reads kv head `head // (hq // hk)`; nothing is copied,
and the rows of a program may be several query heads of one kv head (`group`), which then share every
key and value load.

A record reads only its own rows of `cu_seqlens`, and the reduction order over its keys is fixed by its
own length, so its result does not depend on the other records of the pack (batch invariance exactly).
The grid covers the longest record (`max_seqlen`); programs past their record's end return at once, so a
CUDA graph can capture a static grid with padding records behind the real ones.

Triton's JIT reads kernel arguments without Python annotations, so this module alone is checked without
`disallow_untyped_defs` (see pyproject.toml); nothing outside `engine.kernels.attention` calls it.
"""

import triton
import triton.language as tl


@triton.jit
def _attend_block(
    q,
    acc,
    m_i,
    l_i,
    k_ptr,
    v_ptr,
    rows,
    start,
    end,
    length,
    kv_row_stride,
    kv_col,
    scale_log2,
    causal: tl.constexpr,
    block_n: tl.constexpr,
    d: tl.constexpr,
):
    # Attend the query block `q` (BM, d) to key rows [start, end) of the record (block_n at a time),
    # updating the accumulator (BM, d), row maxima and row sums (BM,) in the log2 domain.
    dims = tl.arange(0, d)
    for kb in range(start, end, block_n):
        cols = kb + tl.arange(0, block_n)  # (BN,) key positions within the record
        kv_off = cols.to(tl.int64)[:, None] * kv_row_stride + kv_col + dims[None, :]  # (BN, d)
        if causal:
            live = cols < length
            kt = tl.load(k_ptr + kv_off, mask=live[:, None], other=0.0)
            vt = tl.load(v_ptr + kv_off, mask=live[:, None], other=0.0)
        else:
            kt = tl.load(k_ptr + kv_off)
            vt = tl.load(v_ptr + kv_off)
        s = tl.dot(q, tl.trans(kt)) * scale_log2  # (BM, BN) float32
        if causal:
            seen = (rows[:, None] >= cols[None, :]) & (cols[None, :] < length)
            s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(vt.dtype), vt, acc * alpha[:, None])
        m_i = m_new
    return acc, m_i, l_i


@triton.jit(do_not_specialize=["num_m_blocks"])  # one compiled kernel whatever the longest record
def _packed_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    cu_ptr,
    scale_log2,
    num_m_blocks,
    hq: tl.constexpr,
    hk: tl.constexpr,
    d: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    group: tl.constexpr,
):
    # q, o (T, hq, d); k, v (T, hk, d), all contiguous; cu (N+1,) record boundaries on the packed axis.
    # Grid (num_m_blocks, hq / group, N). A program's block_m query rows are block_m / group tokens times
    # `group` query heads of one kv head (row r: token r // group, head r % group), so each key and value
    # block it loads serves `group` heads. The last query blocks of a record, which attend to the most
    # keys, start first.
    mblk = num_m_blocks - 1 - tl.program_id(0)
    head0 = tl.program_id(1) * group
    rec = tl.program_id(2)
    tokens: tl.constexpr = block_m // group
    first = tl.load(cu_ptr + rec)
    length = tl.load(cu_ptr + rec + 1) - first
    m0 = mblk * tokens
    if m0 >= length:
        return
    base = first.to(tl.int64)
    r = tl.arange(0, block_m)
    rows = m0 + r // group  # (BM,) query token positions within the record
    heads = head0 + r % group  # (BM,) query heads
    dims = tl.arange(0, d)
    q_off = (base + rows.to(tl.int64))[:, None] * (hq * d) + heads[:, None] * d + dims[None, :]  # (BM, d)
    live = rows < length
    q = tl.load(q_ptr + q_off, mask=live[:, None], other=0.0)
    kv_col = (head0 // (hq // hk)) * d
    k_rec = k_ptr + base * (hk * d)
    v_rec = v_ptr + base * (hk * d)
    acc = tl.zeros([block_m, d], dtype=tl.float32)
    m_i = tl.full([block_m], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([block_m], dtype=tl.float32)
    diag = (m0 // block_n) * block_n  # key blocks before it are wholly visible to every query row
    acc, m_i, l_i = _attend_block(
        q, acc, m_i, l_i, k_rec, v_rec, rows, 0, diag, length, hk * d, kv_col, scale_log2, False, block_n, d
    )
    stop = tl.minimum(m0 + tokens, length)
    acc, m_i, l_i = _attend_block(
        q, acc, m_i, l_i, k_rec, v_rec, rows, diag, stop, length, hk * d, kv_col, scale_log2, True, block_n, d
    )
    out = acc / l_i[:, None]
    tl.store(o_ptr + q_off, out.to(o_ptr.dtype.element_ty), mask=live[:, None])
