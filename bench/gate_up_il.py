"""The gate/up expert GEMM on the weight layout gate rows first, then up rows, against the interleaved one
(row 2 n gate n, row 2 n + 1 up n; `engine.kernels.fp8.Fp8Experts`): one full-size MoE layer's gate/up
weights (128 x 1,536 x 2,048: 805 MB in bf16, so every call reads them from HBM), T tokens routed uniformly
at random (the levelled load).

- bf16: the shipped kernel (`engine.kernels.moe_triton`, halves layout) at its shipped shape against the
  interleaved bench kernel (`bench.gate_up_il_triton`) over a few shapes;
- e4m3: the kernel before the interleaved layout (`bench.gate_up_il_triton._gate_up_halves_fp8_kernel`) at
  the shapes it shipped with, against the shipped interleaved kernel (`engine.kernels.moe_fp8_triton`) at
  its shipped shape and over a few shapes.

`python3 -m bench.gate_up_il --out DIR [--tokens 800,4096,16384,65536]` prints, per T and dtype,
microseconds per call (CUDA graph replays, `bench.timing.graph_us`), TFLOP/s and the weight-read rate, and
max |diff| of each interleaved output against the halves one (the same k steps, so 0 or a rounding step).
Writes `gate_up_il.jsonl`. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from bench.moe_kernels import EXPERTS, HIDDEN, INTER, TOP_K, kernel_info, routed
from bench.report import emit_line
from bench.timing import graph_us
from engine.kernels import moe, moe_fp8
from engine.kernels.fp8 import FP8, FP8_MAX, interleave_gate_up, quantize_experts, quantize_rows
from engine.kernels.tiles import Tiles

# (block_m, block_n per half, block_k, warps, stages, tma)
_BF16: tuple[Shape, ...] = (
    (64, 32, 64, 4, 4, False),
    (64, 64, 64, 4, 4, False),
    (64, 64, 64, 4, 4, True),
    (64, 128, 64, 8, 4, True),
    (128, 64, 64, 8, 4, True),
    (128, 128, 64, 8, 3, True),
    (128, 128, 64, 8, 4, True),
)
# the e4m3 kernel's shapes before the interleaved layout (tiles.json then): small TMA, large pointer loads
_HALVES_SMALL: Shape = (64, 256, 128, 8, 3, True)
_HALVES_LARGE: Shape = (128, 128, 128, 8, 3, False)
_FP8: tuple[Shape, ...] = (
    (64, 128, 128, 8, 3, True),
    (64, 128, 128, 4, 3, True),
    (64, 256, 128, 8, 3, False),
    (64, 256, 128, 8, 2, False),
    (64, 256, 64, 8, 4, False),
    (64, 128, 128, 4, 4, False),
    (32, 256, 128, 8, 3, False),
    (128, 128, 128, 8, 3, False),
    (128, 128, 128, 8, 3, True),
    (128, 128, 128, 8, 4, True),
    (128, 256, 128, 8, 3, False),
)


def halves_of(w: torch.Tensor) -> torch.Tensor:
    """`engine.kernels.fp8.interleave_gate_up` undone: (E, 2I, H) interleaved -> gate rows, then up rows."""
    e, two_i, h = w.shape
    return w.view(e, two_i // 2, 2, h).transpose(1, 2).reshape(e, two_i, h).contiguous()


def _grid(pairs: int, block_m: int, block_n: int) -> tuple[int]:
    return (moe.row_tiles(pairs, EXPERTS, block_m) * (INTER // block_n),)


T = torch.Tensor
Shape = tuple[int, int, int, int, int, bool]  # block_m, block_n (per half), block_k, warps, stages, tma


def bf16_shipped(x: T, w: T, order: T, counts: T, top_w: T, out: T, t: Tiles) -> None:
    """The shipped bf16 gate/up kernel (gate rows first, then up rows) at shape `t`."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from engine.kernels.moe_triton import _moe_gate_up_kernel, _moe_gate_up_tma_kernel

    shapes = {"hidden": HIDDEN, "inter": INTER, "e": EXPERTS, "e_pad": EXPERTS, "top_k": TOP_K}
    tiles = {"block_m": t.block_m, "block_n": t.block_n, "block_k": t.block_k, "num_warps": t.warps}
    grid = _grid(out.shape[0], t.block_m, t.block_n)
    if t.tma:
        desc = TensorDescriptor.from_tensor(w, [1, t.block_n, t.block_k])
        _moe_gate_up_tma_kernel[grid](
            x, desc, order, counts, top_w, out, **shapes, **tiles, stages=t.stages, ws=t.ws
        )
    else:
        _moe_gate_up_kernel[grid](x, w, order, counts, top_w, out, **shapes, **tiles, num_stages=t.stages)


def bf16_il(x: T, w_il: T, order: T, counts: T, top_w: T, out: T, t: Shape) -> None:
    """The bench's interleaved bf16 gate/up kernel at shape `t`."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from bench.gate_up_il_triton import _gate_up_il_kernel

    bm, bn, bk, warps, stages, tma = t
    w = TensorDescriptor.from_tensor(w_il, [1, 2 * bn, bk]) if tma else w_il
    _gate_up_il_kernel[_grid(out.shape[0], bm, bn)](
        x, w, order, counts, top_w, out, hidden=HIDDEN, inter=INTER, e=EXPERTS, e_pad=EXPERTS,
        top_k=TOP_K, block_m=bm, block_n=bn, block_k=bk, stages=stages, tma=tma, num_warps=warps,
    )  # fmt: skip


def fp8_gate_up(
    xq: T, xs: T, w: T, ws: T, order: T, counts: T, top_w: T, act: T, act_s: T, t: Shape, halves: bool
) -> None:
    """The e4m3 gate/up kernel at shape `t`: the engine's (interleaved `w`, `ws`) or, with `halves`, the
    one before it (gate rows first)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from bench.gate_up_il_triton import _gate_up_halves_fp8_kernel
    from engine.kernels.moe_fp8_triton import _moe_gate_up_fp8_kernel

    bm, bn, bk, warps, stages, tma = t
    kernel = _gate_up_halves_fp8_kernel if halves else _moe_gate_up_fp8_kernel
    box = [1, bn if halves else 2 * bn, bk]
    wd = TensorDescriptor.from_tensor(w, box) if tma else w
    kernel[_grid(act.shape[0], bm, bn)](
        xq, xs, wd, ws, order, counts, top_w, act, act_s, hidden=HIDDEN, inter=INTER, e=EXPERTS,
        e_pad=EXPERTS, top_k=TOP_K, group=moe_fp8.GROUP, fp8_max=FP8_MAX, block_m=bm, block_n=bn,
        block_k=bk, stages=stages, tma=tma, num_warps=warps,
    )  # fmt: skip


def _shape(t: Tiles) -> list[object]:
    return [t.block_m, t.block_n, t.block_k, t.warps, t.stages, t.tma, t.ws]


def _time(fn: Callable[[], None]) -> float | str:
    try:
        return round(graph_us(fn), 1)
    except Exception as exc:  # a shape that fails to compile is a row, not an abort
        return f"{type(exc).__name__}: {str(exc)[:160]}"


def _row(
    kind: str, dtype: str, tokens: int, shape: object, us: float | str, wbytes: int, diff: float | None
) -> dict[str, object]:
    flop = 2.0 * tokens * TOP_K * HIDDEN * 2 * INTER
    row: dict[str, object] = {"kind": kind, "dtype": dtype, "tokens": tokens, "shape": shape, "us": us}
    if isinstance(us, float):
        row["tflop_s"] = round(flop / us / 1e6, 1)
        row["weights_tb_s"] = round(wbytes / us / 1e6, 2)
    if diff is not None:
        row["max_abs_diff"] = diff
    return row


def run(tokens: list[int], out: Path) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: list[str] = []
    emit_line(rows, **kernel_info())
    w = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen, device="cuda") * 0.02).bfloat16()
    w_il = interleave_gate_up(w)
    down = torch.zeros(EXPERTS, HIDDEN, INTER, dtype=torch.bfloat16, device="cuda")
    q8 = quantize_experts(w, down)  # gate/up interleaved
    w8_h, ws8_h = halves_of(q8.gate_up), halves_of(q8.gate_up_scale[..., None])[..., 0].contiguous()
    del down
    for t in tokens:
        top_w, order, counts, _ = routed(t, gen)
        order = order.int()
        x = torch.randn(t, HIDDEN, generator=gen, device="cuda").bfloat16()
        pairs = t * TOP_K
        ref = torch.empty(pairs, INTER, dtype=torch.bfloat16, device="cuda")
        got = torch.empty_like(ref)
        shipped = moe.tiles_for(pairs, EXPERTS).gate_up
        bf16_shipped(x, w, order, counts, top_w, ref, shipped)
        us = _time(partial(bf16_shipped, x, w, order, counts, top_w, ref, shipped))
        emit_line(rows, **_row("shipped", "bf16", t, _shape(shipped), us, w.numel() * 2, None))
        for shape in _BF16:
            if (shape[0] >= 128 and t < 4096) or (shape[0] <= 64 and t > 16384):
                continue
            got.zero_()
            us = _time(partial(bf16_il, x, w_il, order, counts, top_w, got, shape))
            diff = float((got.float() - ref.float()).abs().max()) if isinstance(us, float) else None
            emit_line(rows, **_row("interleaved", "bf16", t, list(shape), us, w.numel() * 2, diff))
        xq, xs = quantize_rows(x)
        act = torch.empty(pairs, INTER, dtype=FP8, device="cuda")
        act_s = torch.empty(pairs, INTER // moe_fp8.GROUP, dtype=torch.float32, device="cuda")
        act2, act_s2 = torch.empty_like(act), torch.empty_like(act_s)
        halves = _HALVES_LARGE if pairs >= moe_fp8.LARGE_FROM_ROWS_PER_EXPERT * EXPERTS else _HALVES_SMALL
        run_h = partial(fp8_gate_up, xq, xs, w8_h, ws8_h, order, counts, top_w, act, act_s, halves, True)
        run_h()
        emit_line(rows, **_row("halves", "fp8", t, list(halves), _time(run_h), w.numel(), None))
        ref8 = act.float() * act_s.repeat_interleave(moe_fp8.GROUP, dim=1)
        g = moe_fp8.tiles_for(pairs, EXPERTS).gate_up
        shipped8 = (g.block_m, max(g.block_n, moe_fp8.GROUP), g.block_k, g.warps, g.stages, g.tma)
        for kind, shape in [("shipped", shipped8)] + [("interleaved", s) for s in _FP8]:
            if kind != "shipped" and ((shape[0] >= 128 and t < 4096) or (shape[0] <= 64 and t > 4096)):
                continue
            act2.zero_()
            us = _time(partial(fp8_gate_up, xq, xs, q8.gate_up, q8.gate_up_scale, order, counts, top_w,
                               act2, act_s2, shape, False))  # fmt: skip
            diff = None
            if isinstance(us, float):
                got8 = act2.float() * act_s2.repeat_interleave(moe_fp8.GROUP, dim=1)
                diff = float((got8 - ref8).abs().max())
            emit_line(rows, **_row(kind, "fp8", t, list(shape), us, w.numel(), diff))
    (out / "gate_up_il.jsonl").write_text("".join(r + "\n" for r in rows))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--tokens", default="800,4096,16384,65536")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run([int(v) for v in args.tokens.split(",")], out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
