"""Triton kernels of the FP8 expert mode's activation quantisation; the typed launchers and PyTorch twins
live in `engine.kernels.fp8`.

Both write one float32 scale per row (amax / e4m3's largest value) and the row divided by it in e4m3.
Triton's JIT reads kernel arguments without Python annotations, so this module alone is checked
without `disallow_untyped_defs` (see pyproject.toml); nothing outside `engine.kernels.fp8` calls it.
"""

import triton
import triton.language as tl


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
    # h's columns interleave gate and up (2 n gate n, 2 n + 1 up n), as `Fp8Experts.gate_up`'s rows do
    g = tl.load(h_ptr + row * (2 * inter) + 2 * cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(h_ptr + row * (2 * inter) + 2 * cols + 1, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + row).to(tl.float32)
    a = g / (1.0 + tl.exp(-g)) * u * w
    scale = tl.maximum(tl.max(tl.abs(a), axis=0), 1e-12) / fp8_max
    tl.store(q_ptr + row * inter + cols, (a / scale).to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row, scale)
