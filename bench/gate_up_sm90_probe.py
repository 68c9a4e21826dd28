"""`python3 -m bench.gate_up_sm90_probe`: the FP8 expert GEMMs as two-CTA-cluster CUDA kernels
(`engine.kernels.moe_fp8_sm90`) against the shipped Triton kernels, on one full-size layer.

One layer as `bench.moe_fp8` builds it (128 experts, random bf16 quantised to e4m3; uniform routing, the
levelled load). It builds the extension first (a `build` line: seconds, and how many clusters of each
kernel fit), then per T of `--tokens` prints, as JSON lines, microseconds per call (CUDA graph replays,
median of 20):

- `gate_up`: the Triton kernel at the shipped regime's shapes and at each regime's, the CUDA kernel
  (persistent: as many clusters as fit, each looping over work items; `each`: one cluster per item; `solo`:
  lone CTAs, no multicast), and how far apart their outputs are: the share of equal e4m3 bytes, and the
  relative difference of the dequantised activations and of the scales;
- `down`: the Triton down kernel ("row_pass") and the CUDA one (both ways) on the same row-scaled
  activations, the share of equal outputs and their relative difference;
- `variant` (each of `--variants`, keys of `moe_fp8_sm90.VARIANTS`): both kernels of that build, persistent
  and `solo`, and whether their outputs equal the default build's;
- `sweep` (T in `--sweep`): both CUDA kernels at 1, 4, 16, 33 and as many clusters as fit (0), with
  clusters and `solo` (lone CTAs, no multicast), each with its work items and the us one cluster spends on
  a k step (`step_us`: about 0.56 would be the tensor cores' rate on an H100); and `ablate` lines: each
  kernel without its loads and without its epilogue, and with `--ablate-products`, after the sweep, without
  its tensor-core products (wrong results, the time of the rest alone; such a run never ended on an H100);
- `block`: the whole expert block (gate/up, down, no sum) as shipped; with the CUDA gate/up followed by the
  Triton down kernel ("row_fused", the same values as the shipped "row_pass"); with both CUDA kernels and
  the requantising pass between; each one's relative difference from the shipped block, and the shipped and
  all-CUDA blocks' distance from the float32 twin (T <= 8,192); last for each T, left out with `--no-block`.

A line on stderr names each timed step as it starts, so a call cut at its limit shows where it stood.

Writes `gate_up_sm90_probe.jsonl` to `--out`. A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from bench.moe_fp8 import rel
from bench.moe_kernels import EXPERTS, HIDDEN, TOP_K, kernel_info, random_experts, uniform_routing
from bench.report import emit_line as emit
from bench.report import start
from bench.timing import graph_us
from engine.kernels import fp8, moe, moe_fp8, moe_fp8_sm90
from engine.kernels.tiles import MoeTiles

EACH = 1 << 30
"""`clusters` for one two-CTA cluster per work item (not persistent)."""
BEGAN = time.perf_counter()


def progress(step: str) -> None:
    """One line on stderr before each timed step (a device call cut at its limit shows where it stood)."""
    print(f"gate_up_sm90_probe: {step} at {time.perf_counter() - BEGAN:.1f} s", file=sys.stderr, flush=True)


def pair_tiles(counts: list[int]) -> int:
    """The real 256-row pair tiles of these per-expert row counts (work items per column block)."""
    return sum((c + 255) // 256 for c in counts)


def step_us(us: float, clusters: int, fit: int, items: int, ksteps: int) -> float:
    """Microseconds one cluster spends on one k step: `us` for `items` work items of `ksteps` steps each,
    spread over `clusters` clusters (0: `fit`, as many as fit), never more than there are items. Solo runs
    twice the CTAs on twice the half items: the same figure."""
    active = min(clusters or fit, items)
    return us * active / (items * ksteps) if items else 0.0


def dequantised(act: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(S, I) float32 from e4m3 rows and their (S, I / 128) scales."""
    s, inter = act.shape
    return (act.float().view(s, inter // moe_fp8_sm90.GROUP, -1) * scales[..., None]).view(s, inter)


def where_apart(a: torch.Tensor, b: torch.Tensor, counts: torch.Tensor) -> dict[str, object]:
    """Where two (S, I) activations differ by more than 5% of a row's norm: how many rows, and how those rows
    spread over the four 64-row quarters of a 256-row pair tile and over four 32-channel quarters of each
    128-channel block (what a wrong fragment, stage or CTA of the kernel would show)."""
    row_rel = (a - b).norm(dim=1) / b.norm(dim=1).clamp_min(1e-30)
    bad = row_rel > 0.05
    starts = torch.cumsum(counts, 0) - counts  # (E,) first sorted row of each expert
    expert = torch.repeat_interleave(torch.arange(counts.numel(), device=a.device), counts.long())
    in_tile = (torch.arange(a.shape[0], device=a.device) - starts[expert]) % 256
    quarters = torch.bincount(in_tile[bad] // 64, minlength=4)
    col_bad = ((a - b).abs() > 0.05 * b.abs().amax(dim=1, keepdim=True))[bad]  # (bad rows, I)
    col_quarters = col_bad.reshape(col_bad.shape[0], a.shape[1] // 128, 4, 32).sum(dim=(0, 1, 3))
    return {
        "bad_rows": int(bad.sum()),
        "bad_row_quarters": quarters.tolist(),
        "bad_col_quarters": col_quarters.tolist(),
    }


def probe(
    rows: list[str],
    t: int,
    q8: fp8.Fp8Experts,
    ext: moe_fp8_sm90.Extension,
    gen: torch.Generator,
    sweep: frozenset[int] = frozenset(),
    fit: tuple[int, int] = (0, 0),
    block: bool = True,
    variants: dict[str, moe_fp8_sm90.Extension] | None = None,
    ablate_products: bool = False,
) -> None:
    """The `gate_up` and `down` lines of T = `t` tokens; a `variant` line for each of `variants`; with `t` in
    `sweep`, the `ablate` and `sweep` lines (with `ablate_products`, then the products' `ablate` lines); then,
    with `block`, the `block` line."""
    variants = variants or {}
    progress(f"T={t} gate_up and down")
    x = torch.randn(t, HIDDEN, device="cuda", generator=gen).bfloat16()
    top_w, top_i = uniform_routing(t, gen)
    xq = fp8.quantize_rows(x)
    order, counts = moe.group_by_expert(top_i, EXPERTS)
    act_t, s_t = moe_fp8.activations_fp8(x, order, counts, top_w, q8, row_pass=False, xq=xq)
    act_c, s_c = moe_fp8_sm90.gate_up_fp8(ext, x, order, counts, top_w, q8, xq=xq)
    torch.cuda.synchronize()
    regime = "large" if moe_fp8.tiles_for(t * TOP_K, EXPERTS) is moe_fp8.LARGE else "small"

    def cuda(
        clusters: int, *, solo: bool = False, ablate: int = 0, build: moe_fp8_sm90.Extension = ext
    ) -> fp8.Quantized:
        return moe_fp8_sm90.gate_up_fp8(
            build, x, order, counts, top_w, q8, xq=xq, clusters=clusters, solo=solo, ablate=ablate
        )

    def triton(tiles: MoeTiles | None) -> fp8.Quantized:
        return moe_fp8.activations_fp8(x, order, counts, top_w, q8, tiles, row_pass=False, xq=xq)

    emit(
        rows,
        kind="gate_up",
        tokens=t,
        regime=regime,
        triton_us=round(graph_us(lambda: triton(None)), 1),
        triton_small_us=round(graph_us(lambda: triton(moe_fp8.SMALL)), 1),
        triton_large_us=round(graph_us(lambda: triton(moe_fp8.LARGE)), 1),
        cuda_us=round(graph_us(lambda: cuda(0)), 1),
        cuda_each_us=round(graph_us(lambda: cuda(EACH)), 1),
        cuda_solo_us=round(graph_us(lambda: cuda(0, solo=True)), 1),
        bytes_equal=round(float((act_t.view(torch.uint8) == act_c.view(torch.uint8)).float().mean()), 6),
        act_rel=rel(dequantised(act_c, s_c), dequantised(act_t, s_t)),
        scale_rel=rel(s_c, s_t),
        **where_apart(dequantised(act_c, s_c), dequantised(act_t, s_t), counts),
    )

    act_r, row_s = moe_fp8.activations_fp8(x, order, counts, top_w, q8, row_pass=True, xq=xq)

    def down_triton() -> torch.Tensor:
        return moe_fp8.down_pairs_fp8(act_r, row_s, order, counts, q8, t, TOP_K, way="row_pass")

    def down_cuda(
        clusters: int, *, solo: bool = False, ablate: int = 0, build: moe_fp8_sm90.Extension = ext
    ) -> torch.Tensor:
        return moe_fp8_sm90.down_fp8(
            build, act_r, row_s, order, counts, q8, clusters=clusters, solo=solo, ablate=ablate
        )

    d_t = down_triton()
    d_c = moe_fp8_sm90.down_fp8(ext, act_r, row_s, order, counts, q8)
    emit(
        rows,
        kind="down",
        tokens=t,
        triton_us=round(graph_us(down_triton), 1),
        cuda_us=round(graph_us(lambda: moe_fp8_sm90.down_fp8(ext, act_r, row_s, order, counts, q8)), 1),
        cuda_each_us=round(graph_us(lambda: down_cuda(EACH)), 1),
        cuda_solo_us=round(graph_us(lambda: down_cuda(0, solo=True)), 1),
        equal=round(float((d_t == d_c).float().mean()), 6),
        rel=rel(d_c, d_t),
    )

    for name, built in variants.items():
        progress(f"T={t} variant {name}")
        act_v, s_v = cuda(0, build=built)
        d_v = down_cuda(0, build=built)
        emit(
            rows,
            kind="variant",
            variant=name,
            tokens=t,
            gate_up_us=round(graph_us(lambda: cuda(0, build=built)), 1),  # noqa: B023
            gate_up_solo_us=round(graph_us(lambda: cuda(0, solo=True, build=built)), 1),  # noqa: B023
            down_us=round(graph_us(lambda: down_cuda(0, build=built)), 1),  # noqa: B023
            down_solo_us=round(graph_us(lambda: down_cuda(0, solo=True, build=built)), 1),  # noqa: B023
            same_as_default=bool(
                torch.equal(act_v.view(torch.uint8), act_c.view(torch.uint8))
                and torch.equal(s_v, s_c)
                and torch.equal(d_v, d_c)
            ),
        )

    def ablate_line(ablate: int, solo: bool) -> None:
        name = ("no_products", "no_loads", "no_epilogue")[ablate - 1]
        progress(f"T={t} ablate {name} solo {solo}: gate_up")
        gu_us = graph_us(lambda: cuda(0, solo=solo, ablate=ablate))
        progress(f"T={t} ablate {name} solo {solo}: down")
        dn_us = graph_us(lambda: down_cuda(0, solo=solo, ablate=ablate))
        timed = {"gate_up_us": round(gu_us, 1), "down_us": round(dn_us, 1)}
        emit(rows, kind="ablate", tokens=t, ablate=name, solo=solo, **timed)

    if t in sweep:
        for ablate in (2, 3):  # without the loads, without the epilogue
            for solo in (False, True):
                ablate_line(ablate, solo)
        tiles = pair_tiles([int(c) for c in counts.tolist()])
        inter = q8.down.shape[2]
        gu_items, dn_items = tiles * (inter // 128), tiles * (HIDDEN // 256)
        for clusters in (1, 4, 16, 33, 0):
            for solo in (False, True):
                progress(f"T={t} sweep {clusters} clusters, solo {solo}")
                gu_us = graph_us(lambda: cuda(clusters, solo=solo))  # noqa: B023
                dn_us = graph_us(lambda: down_cuda(clusters, solo=solo))  # noqa: B023
                emit(
                    rows,
                    kind="sweep",
                    tokens=t,
                    clusters=clusters,
                    solo=solo,
                    gate_up_us=round(gu_us, 1),
                    down_us=round(dn_us, 1),
                    items=[gu_items, dn_items],
                    gate_up_step_us=round(step_us(gu_us, clusters, fit[0], gu_items, HIDDEN // 128), 3),
                    down_step_us=round(step_us(dn_us, clusters, fit[1], dn_items, inter // 128), 3),
                )
        if ablate_products:  # last: the first such run on an H100 never ended (round fourteen)
            for solo in (False, True):
                ablate_line(1, solo)
    if not block:
        return
    progress(f"T={t} block")

    def shipped() -> torch.Tensor:
        return moe_fp8.experts_pairs_fp8(x, order, counts, top_w, q8, xq=xq)

    def cuda_gate_up() -> torch.Tensor:
        a, s = moe_fp8_sm90.gate_up_fp8(ext, x, order, counts, top_w, q8, xq=xq)
        return moe_fp8.down_pairs_fp8(a, s, order, counts, q8, t, TOP_K, way="row_fused")

    def cuda_both() -> torch.Tensor:
        return moe_fp8_sm90.experts_pairs_fp8(ext, x, order, counts, top_w, q8, xq=xq)

    y_shipped, y_gate_up, y_both = shipped(), cuda_gate_up(), cuda_both()
    line: dict[str, object] = {
        "kind": "block",
        "tokens": t,
        "shipped_us": round(graph_us(shipped), 1),
        "cuda_gate_up_us": round(graph_us(cuda_gate_up), 1),
        "cuda_both_us": round(graph_us(cuda_both), 1),
        "gate_up_rel": rel(y_gate_up, y_shipped),
        "both_rel": rel(y_both, y_shipped),
    }
    if t <= 8192:
        progress(f"T={t} float32 twin")
        twin = moe_fp8.experts_pairs_fp8_reference(x, order, counts, top_w, q8, "row_pass")
        line["shipped_vs_twin"] = rel(y_shipped, twin)
        line["cuda_both_vs_twin"] = rel(y_both, twin)
    emit(rows, **line)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--tokens", default="1,64,800,1536,3072,4096,6144,16384,65536")
    p.add_argument("--build-dir", type=Path, default=moe_fp8_sm90.BUILD_DIR)
    p.add_argument("--sweep", default="64,3072,65536", help="token counts that get the `sweep` lines")
    p.add_argument(
        "--variants",
        default="",
        help=f"comma-separated builds to time beside the default, of {', '.join(moe_fp8_sm90.VARIANTS)}",
    )
    p.add_argument(
        "--no-block",
        action="store_true",
        help="leave out the `block` lines (the whole block, and its float32 twin up to 8,192 tokens)",
    )
    p.add_argument(
        "--ablate-products",
        action="store_true",
        help="also time the kernels without their products, after the sweep (the first such run never ended)",
    )
    args, out, rows = start(p)
    if unknown := set(filter(None, args.variants.split(","))) - set(moe_fp8_sm90.VARIANTS):
        p.error(f"unknown variants {sorted(unknown)}: known are {', '.join(moe_fp8_sm90.VARIANTS)}")
    emit(rows, **kernel_info())
    began = time.perf_counter()
    ext = moe_fp8_sm90.build(args.build_dir)
    gate_up_fit, down_fit = ext.clusters_fit()
    emit(rows, kind="build", seconds=round(time.perf_counter() - began, 1), fit=[gate_up_fit, down_fit])
    variants = {v: moe_fp8_sm90.build(args.build_dir, variant=v) for v in args.variants.split(",") if v}
    sweep = frozenset(int(v) for v in args.sweep.split(",") if v)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q8 = fp8.quantize_experts(*random_experts(gen))
    with torch.inference_mode():
        for t in (int(v) for v in args.tokens.split(",")):
            probe(
                rows,
                t,
                q8,
                ext,
                gen,
                sweep,
                (gate_up_fit, down_fit),
                block=not args.no_block,
                variants=variants,
                ablate_products=args.ablate_products,
            )
            (out / "gate_up_sm90_probe.jsonl").write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
