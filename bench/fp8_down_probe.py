"""`python3 -m bench.fp8_down_probe`: the FP8 expert block's down half two ways, on one full-size layer.

The shipped large-batch way (`engine.kernels.moe_fp8`, "row_pass"): the Triton gate/up kernel writes the
activations in expert order, a pass brings each row to one scale, and the Triton down kernel stores each
pair's row at its place in pair order, which the MoE sum reads k contiguous rows at a time. The other way
keeps the same activations and hands them, in expert order, to CUTLASS's grouped GEMM
(`torch._scaled_grouped_mm` through `engine.kernels.fp8.grouped_mm`, row and channel scales, warp
specialised and persistent), and the sum gathers each token's rows through the inverse permutation.

One layer as `bench.moe_fp8` builds it (128 experts, random bf16 quantised to e4m3, so every call reads the
weights from HBM; uniform routing, the levelled load). Per T of `--tokens`, as JSON lines, microseconds per
call (CUDA graph replays, median of 20): `part` lines for each kernel alone (grouping with and without the
inverse, gate/up with the row pass, down each way, the sum each way) and a `block` line for the whole block
each way (grouping to the normalised e4m3 rows of the next layer), with the two ways' difference (relative
norm) and each way's distance from the float32 twin (T <= 8,192); a `ceiling` line per T times cuBLAS's
dense FP8 GEMM over the same rows and one expert's weights (the card's rate for these shapes). Writes
`fp8_down_probe.jsonl` to `--out`. A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os

import torch

from bench.moe_fp8 import rel
from bench.moe_kernels import EXPERTS, HIDDEN, INTER, TOP_K, kernel_info, random_experts, uniform_routing
from bench.report import emit_line as emit
from bench.report import start
from bench.timing import graph_us
from engine.kernels import elementwise, fp8, moe, moe_fp8

EPS = 1e-6


def probe(rows: list[str], t: int, q8: fp8.Fp8Experts, gen: torch.Generator) -> None:
    """The `part` and `block` lines of T = `t` tokens."""
    x = torch.randn(t, HIDDEN, device="cuda", generator=gen).bfloat16()
    res = torch.randn(t, HIDDEN, device="cuda", generator=gen).bfloat16()
    norm_w = (1 + 0.1 * torch.randn(HIDDEN, device="cuda", generator=gen)).bfloat16()
    top_w, top_i = uniform_routing(t, gen)
    xq = fp8.quantize_rows(x)
    order, counts = moe.group_by_expert(top_i, EXPERTS)
    order_i, ends, inv = moe.group_by_expert_inverse(top_i, EXPERTS)
    assert torch.equal(order, order_i)
    act, row_s = moe_fp8.activations_fp8(x, order, counts, top_w, q8, row_pass=True, xq=xq)
    y_pairs = moe_fp8.down_pairs_fp8(act, row_s, order, counts, q8, t, TOP_K, way="row_pass")
    y_sorted = fp8.grouped_mm(act, row_s, q8.down, q8.down_scale, ends)

    def sum_pairs() -> object:
        return elementwise.add_pairs_rms_norm_fp8(res, y_pairs, None, TOP_K, norm_w, EPS, keep_normed=False)

    def sum_inv() -> object:
        return elementwise.add_pairs_rms_norm_fp8(res, y_sorted, inv, TOP_K, norm_w, EPS, keep_normed=False)

    parts = {
        "group": lambda: moe.group_by_expert(top_i, EXPERTS),
        "group_inverse": lambda: moe.group_by_expert_inverse(top_i, EXPERTS),
        "gate_up_row_pass": lambda: moe_fp8.activations_fp8(x, order, counts, top_w, q8, xq=xq),
        "down_triton_pairs": lambda: moe_fp8.down_pairs_fp8(act, row_s, order, counts, q8, t, TOP_K),
        "down_cutlass_sorted": lambda: fp8.grouped_mm(act, row_s, q8.down, q8.down_scale, ends),
        "sum_pairs": sum_pairs,
        "sum_inverse": sum_inv,
    }
    for name, fn in parts.items():
        emit(rows, kind="part", tokens=t, part=name, us=round(graph_us(fn), 1))
    ceiling(
        rows,
        t,
        fp8.gather_rows(xq[0], order.long() // TOP_K),
        xq[1].index_select(0, order // TOP_K),
        act,
        row_s,
        q8,
    )

    def shipped() -> object:
        o, c = moe.group_by_expert(top_i, EXPERTS)
        y = moe_fp8.experts_pairs_fp8(x, o, c, top_w, q8, xq=xq)
        return elementwise.add_pairs_rms_norm_fp8(res, y, None, TOP_K, norm_w, EPS, keep_normed=False)

    def cutlass_down() -> object:
        o, e, i = moe.group_by_expert_inverse(top_i, EXPERTS)
        c = torch.diff(e, prepend=e.new_zeros(1))
        a, s = moe_fp8.activations_fp8(x, o, c, top_w, q8, row_pass=True, xq=xq)
        y = fp8.grouped_mm(a, s, q8.down, q8.down_scale, e)
        return elementwise.add_pairs_rms_norm_fp8(res, y, i, TOP_K, norm_w, EPS, keep_normed=False)

    line: dict[str, object] = {
        "kind": "block",
        "tokens": t,
        "regime": "large" if moe_fp8.tiles_for(t * TOP_K, EXPERTS) is moe_fp8.LARGE else "small",
        "shipped_us": round(graph_us(shipped), 1),
        "cutlass_down_us": round(graph_us(cutlass_down), 1),
        "ways_rel": rel(y_sorted.index_select(0, inv), y_pairs),
    }
    if t <= 8192:
        twin = moe_fp8.experts_pairs_fp8_reference(x, order, counts, top_w, q8, "row_pass")
        line["shipped_vs_twin"] = rel(y_pairs, twin)
        line["cutlass_vs_twin"] = rel(y_sorted.index_select(0, inv), twin)
    emit(rows, **line)


def ceiling(
    rows: list[str],
    t: int,
    xs: torch.Tensor,
    xs_scale: torch.Tensor,
    act: torch.Tensor,
    act_s: torch.Tensor,
    q8: fp8.Fp8Experts,
) -> None:
    """The `ceiling` line: cuBLAS's dense row-scaled FP8 GEMM (`torch._scaled_mm` through
    `engine.kernels.fp8.linear_fp8`) over all S = T k rows at once against one expert's weights, gate/up
    (S, H) x (H, 2I) and down (S, I) x (I, H): what the card gives these shapes without groups, gather or
    epilogue, beside the `part` lines' grouped kernels."""
    flops = {"gate_up": 2.0 * t * TOP_K * HIDDEN * 2 * INTER, "down": 2.0 * t * TOP_K * INTER * HIDDEN}
    gate_up = fp8.Fp8Linear(q8.gate_up[0], q8.gate_up_scale[0], None)
    down = fp8.Fp8Linear(q8.down[0], q8.down_scale[0], None)
    us = {
        "gate_up": graph_us(lambda: fp8.linear_fp8(None, gate_up, (xs, xs_scale))),
        "down": graph_us(lambda: fp8.linear_fp8(None, down, (act, act_s))),
    }
    line: dict[str, object] = {"kind": "ceiling", "tokens": t}
    for name, value in us.items():
        line[f"{name}_dense_us"] = round(value, 1)
        line[f"{name}_dense_tflop_s"] = round(flops[name] / value / 1e6, 1)
    emit(rows, **line)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--tokens", default="800,3072,8192,16384,65536")
    args, out, rows = start(p)
    emit(rows, **kernel_info())
    gen = torch.Generator(device="cuda").manual_seed(0)
    q8 = fp8.quantize_experts(*random_experts(gen))
    with torch.inference_mode():
        for t in (int(v) for v in args.tokens.split(",")):
            probe(rows, t, q8, gen)
    (out / "fp8_down_probe.jsonl").write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
