"""Where the memset before the FP8 QKV projection comes from, and what avoids it (one GPU, not a test).

The one-request timeline shows, once per layer, a "Memset (Unknown)" before the fused QKV projection's FP8
GEMM (`torch._scaled_mm`, row-wise scales, cuBLASLt's `nvjet ... 2x4` kernel) and about 5 us of idle GPU
around it (BENCHMARKS.md, "Priority classes, round ten"). `python3 -m bench.fp8_gemm_probe --out DIR` times
the attention projections' shapes (QKV 2048 -> 5120, output 4096 -> 2048) at M = 896 (one 800-token
request's graph bucket) and 3,072 tokens, each way of calling the GEMM, inside CUDA graphs (`graph_us`,
five calls a graph, as the decoder's layers follow each other), and counts the memsets and kernels of one
replay (torch profiler):

- `rowwise`: `engine.kernels.fp8.linear_fp8` as shipped (the parent's label is the workspace variable's value,
  or "default" when it is unset);
- `swapped`: the transposed problem (weights as the left operand), then the (N, M) result copied to (M, N);
- `split`: QKV as two GEMMs, the query rows and the key/value rows;
- `exact_accum`: `rowwise` without fast accumulation.

`--child` runs the same in a child process with `CUBLASLT_WORKSPACE_SIZE=0` (no cuBLASLt workspace, so no
split-K that needs one zeroed). Prints JSON lines and writes `fp8_gemm_probe.jsonl` to `--out`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from bench.report import emit_line as emit
from bench.timing import graph_us
from engine.device import CUBLASLT_WORKSPACE_ENV
from engine.kernels import fp8

SHAPES = {"qkv": (2048, 5120), "o_proj": (4096, 2048)}
"""(in, out) features of the full-size attention projections."""
QUERY_ROWS = 4096
"""The QKV projection's query rows (32 heads of 128); the rest are the key and value rows."""


def _exact_accum(xq: fp8.Quantized, w: fp8.Fp8Linear) -> torch.Tensor:
    # `fp8.linear_fp8`'s GEMM without fast accumulation
    out: torch.Tensor = torch._scaled_mm(
        xq[0], w.weight.t(), scale_a=xq[1][:, None], scale_b=w.scale[None, :], out_dtype=torch.bfloat16,
        use_fast_accum=False,
    )  # fmt: skip
    return out


def _swapped(xq: fp8.Quantized, w: fp8.Fp8Linear) -> torch.Tensor:
    out: torch.Tensor = torch._scaled_mm(
        w.weight, xq[0].t(), scale_a=w.scale[:, None], scale_b=xq[1][None, :], out_dtype=torch.bfloat16,
        use_fast_accum=True,
    )  # fmt: skip
    return out.t().contiguous()


def _split(xq: fp8.Quantized, parts: tuple[fp8.Fp8Linear, fp8.Fp8Linear]) -> torch.Tensor:
    return torch.cat([fp8.linear_fp8(None, p, xq) for p in parts], dim=1)


def _replay_counts(fn: Callable[[], object]) -> dict[str, int]:
    """Kernels and memsets of one replay of a graph holding one `fn` call."""
    from torch.profiler import ProfilerActivity, profile

    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if str(e.device_type).endswith("CUDA")]
    return {
        "memsets": sum("Memset" in n for n in names),
        "kernels": sum("Memset" not in n and "Memcpy" not in n for n in names),
    }


def probe(rows: list[str], label: str) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, (k, n) in SHAPES.items():
        w_bf16 = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).bfloat16()
        w = fp8.quantize_linear(w_bf16)
        parts = (fp8.quantize_linear(w_bf16[:QUERY_ROWS]), fp8.quantize_linear(w_bf16[QUERY_ROWS:]))
        for m in (896, 3072):
            x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
            xq = fp8.quantize_rows(x)
            ref = fp8.linear_fp8(None, w, xq)
            ways: dict[str, Callable[[], torch.Tensor]] = {
                "rowwise": partial(fp8.linear_fp8, None, w, xq),
                "swapped": partial(_swapped, xq, w),
                "exact_accum": partial(_exact_accum, xq, w),
            }
            if name == "qkv":
                ways["split"] = partial(_split, xq, parts)
            for way, fn in ways.items():
                got = fn()
                emit(
                    rows, kind="gemm", env=label, shape=name, m=m, way=way, us=round(graph_us(fn), 2),
                    **_replay_counts(fn), max_diff=float((got.float() - ref.float()).abs().max()),
                )  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--child", action="store_true", help="also run with CUBLASLT_WORKSPACE_SIZE=0")
    p.add_argument("--label", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    label = args.label or os.environ.get(CUBLASLT_WORKSPACE_ENV, "default")  # the workspace torch will read
    rows: list[str] = []
    emit(rows, kind="info", gpu=torch.cuda.get_device_name(), torch=torch.__version__)
    probe(rows, label)
    if args.child:
        env = {**os.environ, CUBLASLT_WORKSPACE_ENV: "0"}
        cmd = [sys.executable, "-m", "bench.fp8_gemm_probe", "--out", args.out, "--label", "no_workspace"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=600)
        rows += [line for line in done.stdout.splitlines() if '"gemm"' in line]
        print(done.stdout + done.stderr[-2000:], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.label is None:  # the parent writes the file
        (out / "fp8_gemm_probe.jsonl").write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
