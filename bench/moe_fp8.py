"""One full-size MoE layer on the H200 in FP8: the fused Triton FP8 expert kernels (`engine.kernels.moe_fp8`)
over a sweep of tile shapes, against the unfused CUTLASS FP8 path and the fused bf16 kernels, same run.

`python3 -m bench.moe_fp8 --out DIR` builds one layer's experts as `bench.moe_kernels` does (128 experts,
random bf16, 1.2 GB; quantised to e4m3, 0.6 GB, so every call reads them from HBM) and routes T tokens
uniformly at random: more evenly than the engine's levelled routers, whose busiest expert takes several
times the mean, which favours the large tiles. `--routes FILE` (`bench.one_request`'s routes.json) draws each
token's experts from that spread instead, for `--layers` of its layers from the most even to the least, and
every timing covers those layers one after another (same experts). It prints, as JSON lines:

1. `sweep`: each candidate shape of one FP8 kernel, the other at its best so far (or shipped) shape, per T:
   the whole block's microseconds (CUDA graph replays, median of 20). Each kernel is swept over its own
   regime's candidates (`moe_fp8.tiles_for`, `down_tiles_for`: the regimes switch at different T).
2. `layer`: per T, the whole expert block (from the sorted pairs on, the row quantisation included):
   Triton FP8 at the best swept shapes and at the shipped ones, CUTLASS FP8 (quantise, gather,
   `torch._scaled_grouped_mm`, SwiGLU + quantise, again; its output in expert order), and bf16 fused
   (`engine.kernels.moe`, shipped shapes), with the weight-read rate and TFLOP/s; and the drift of each
   from bf16 (relative norm of the difference) and of Triton FP8 from its float32 twin.
3. `scaling`: per T and per other way of applying the activations' scales in the down GEMM
   (`moe_fp8.SCALINGS`, `--scalings`): the whole block at the best shapes, with at T = 800 and 65,536 a
   sweep of the down kernel's shapes under that scaling first (`sweep` lines with a `scaling` field);
   drift from bf16 and from the twin of the same scaling.
4. `bf16_small_down`: a few more shapes of the bf16 down kernel at T=800 (weight-read bound).

Writes `moe_fp8.jsonl` and `tiles_best.json` (the best shapes per regime, in `tiles.json`'s `moe_fp8`
form; a kernel's shipped shape where no T fell in its regime, the last swept T's where several did) to
`--out`. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import TypeVar

import torch

from bench.moe_kernels import EXPERTS, HIDDEN, INTER, TOP_K, kernel_info, random_experts, routed
from bench.report import emit_line as emit
from bench.timing import graph_us
from engine.kernels import fp8, moe, moe_fp8
from engine.kernels.tiles import MoeTiles, Tiles

_T = TypeVar("_T")

# (block_m, block_n, block_k, warps, stages, tma); the down kernel's block_k is the scale group (128), and
# the gate/up kernel's stays 128 in both regimes (a record's sums then do not depend on its batch's regime).
_SMALL_GATE_UP = (
    (64, 128, 128, 4, 4),
    (64, 128, 128, 4, 4, True),
    (64, 64, 128, 4, 4),
    (64, 64, 128, 4, 6),
    (64, 128, 128, 4, 3),
    (64, 128, 128, 4, 5, True),
    (64, 128, 128, 8, 4, True),
    (64, 256, 128, 8, 3, True),
    # two or three programs per SM (fewer stages or narrower tiles: registers and shared memory allow it)
    (64, 64, 128, 4, 3),
    (64, 64, 128, 4, 3, True),
    (64, 128, 128, 4, 2, True),
    (128, 64, 128, 4, 2, True),
)
_SMALL_DOWN = (
    (64, 128, 128, 4, 4),
    (64, 128, 128, 4, 4, True),
    (64, 64, 128, 4, 4),
    (64, 64, 128, 4, 6),
    (64, 256, 128, 4, 3),
    (64, 256, 128, 8, 3, True),
    (64, 128, 128, 4, 6, True),
    (64, 64, 128, 4, 6, True),
    (32, 128, 128, 4, 4),
    (128, 128, 128, 8, 4, True),
    (64, 128, 128, 8, 3, True),
    (64, 128, 128, 4, 2, True),
    (64, 64, 128, 4, 3, True),
    (128, 64, 128, 4, 3, True),
)
_LARGE_GATE_UP = (
    (128, 128, 128, 8, 3, True),
    (128, 128, 128, 8, 4, True),
    (128, 128, 128, 8, 3),
    (128, 256, 128, 8, 3, True),
    (128, 128, 128, 8, 5, True),
    (64, 128, 128, 4, 4, True),
    (128, 64, 128, 4, 4, True),
)
_LARGE_DOWN = (
    (128, 128, 128, 8, 3, True),
    (128, 128, 128, 8, 4, True),
    (128, 256, 128, 8, 3, True),
    (128, 128, 128, 8, 3),
    (128, 64, 128, 4, 4, True),
    (64, 128, 128, 4, 4, True),
    (128, 256, 128, 8, 2, True),
    (128, 128, 128, 8, 2, True),
    # an expert's ~200 rows of a mid-size batch in one row tile: its weights read once
    (256, 128, 128, 8, 3, True),
    (256, 128, 128, 8, 4, True),
    (256, 64, 128, 8, 4, True),
    (256, 128, 128, 8, 3),
)
_BF16_SMALL_DOWN = (
    (64, 128, 64, 4, 4),
    (64, 128, 128, 4, 3),
    (64, 64, 128, 4, 4),
    (64, 128, 64, 4, 6),
    (64, 256, 64, 8, 4),
)


def _tiles(t: tuple[int | bool, ...]) -> Tiles:
    return Tiles(*t)  # type: ignore[arg-type]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| / |b| over all elements (Frobenius)."""
    return float((a.float() - b.float()).norm() / b.float().norm())


def cutlass_fp8(
    x: torch.Tensor, top_w: torch.Tensor, order: torch.Tensor, counts: torch.Tensor, q8: fp8.Fp8Experts
) -> torch.Tensor:
    """The unfused FP8 block (`PackedTextDecoder._moe` with `fused_experts=False`): (S, H) in expert order."""
    offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
    xq, xs = fp8.quantize_rows(x)
    src = order // TOP_K
    h = fp8.grouped_mm(fp8.gather_rows(xq, src), xs.index_select(0, src), q8.gate_up, q8.gate_up_scale, offs)
    aq, a_s = fp8.swiglu_quantized(h, top_w.reshape(-1)[order])
    return fp8.grouped_mm(aq, a_s, q8.down, q8.down_scale, offs)


def sweep(
    rows: list[str],
    t: int,
    call: partial[torch.Tensor],
    regimes: dict[str, str],
    base: MoeTiles,
    **label: str,
) -> MoeTiles:
    """Each candidate of each kernel named in `regimes` ("gate_up", "down"; each to the candidates of its
    regime: "small", "large", or "both": every one, `--sweep-every`) with the other kernel at `base`;
    returns the best pair. `label` goes into every line."""
    best = base
    every = {
        "gate_up": {"small": _SMALL_GATE_UP, "large": _LARGE_GATE_UP},
        "down": {"small": _SMALL_DOWN, "large": _LARGE_DOWN},
    }
    for kind, regime in regimes.items():
        cands = every[kind].get(regime, tuple(dict.fromkeys(every[kind]["small"] + every[kind]["large"])))
        timed: list[tuple[float, Tiles]] = []
        for c in cands:
            tiles = _tiles(c)
            pair = replace(best, **{kind: tiles})
            try:
                us = graph_us(partial(call, tiles=pair))
            except Exception as exc:  # a shape Triton cannot compile or launch is reported, not fatal
                emit(
                    rows,
                    kind="sweep",
                    tokens=t,
                    kernel=kind,
                    tiles=list(c),
                    error=type(exc).__name__,
                    **label,
                )
                continue
            emit(rows, kind="sweep", tokens=t, kernel=kind, tiles=list(c), us=round(us, 1), **label)
            timed.append((us, tiles))
        if timed:
            best = replace(best, **{kind: min(timed, key=lambda p: p[0])[1]})
    return best


def chosen_profiles(path: Path | None, layers: int) -> list[list[int] | None]:
    """`layers` routing profiles of `path` (`bench.one_request`'s routes.json), spread from the most even
    layer to the least (by the busiest expert's count), or [None] (uniform routing) without a file."""
    if path is None:
        return [None]
    found: list[list[int]] = json.loads(path.read_text())["layers"]
    ranked = sorted(found, key=max)
    n = max(1, min(layers, len(ranked)))
    picks = [round(j * (len(ranked) - 1) / (n - 1)) for j in range(n)] if n > 1 else [len(ranked) // 2]
    return [ranked[i] for i in picks]


def layered(calls: list[partial[_T]], **kw: object) -> _T:
    """Each of `calls` with `kw` in turn (one per routed layer); the last one's output."""
    out = calls[0](**kw)
    for call in calls[1:]:
        out = call(**kw)
    return out


def _regime(m: MoeTiles) -> str:
    return "large" if m is moe_fp8.LARGE else "small"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--tokens", default="800,4096,16384,65536")
    p.add_argument("--scalings", default="row_pass,row_fused", help="down scalings besides the shipped one")
    p.add_argument(
        "--sweep-every",
        action="store_true",
        help="sweep every T, over the candidates of both regimes (default: a regime's first T, and 800 and "
        "65,536)",
    )
    p.add_argument(
        "--sweep-each",
        action="store_true",
        help="sweep every T, each kernel over its own regime's candidates (default: a regime's first T, and"
        " 800 and 65,536)",
    )
    p.add_argument(
        "--routes",
        type=Path,
        default=None,
        help="draw each token's experts from the engine's routers' spread (bench.one_request's routes.json,"
        " levelled) instead of uniformly; every timing then covers --layers such layers, one after another",
    )
    p.add_argument("--layers", type=int, default=4, help="with --routes: how many layers (even to uneven)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []
    emit(rows, **kernel_info())
    profiles = chosen_profiles(args.routes, args.layers)
    emit(rows, kind="routing", routes=str(args.routes) if args.routes else "uniform", layers=len(profiles))
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate_up, down = random_experts(gen)
    q8 = fp8.quantize_experts(gate_up, down)
    fp8_bytes = (q8.gate_up.numel() + q8.down.numel()) * len(profiles)
    best: dict[str, dict[str, Tiles]] = {"gate_up": {}, "down": {}}  # kernel -> regime -> best shape
    for t in (int(s) for s in args.tokens.split(",")):
        x = torch.randn(t, HIDDEN, device="cuda", generator=gen).bfloat16()
        routings = [(w, o.int(), c) for w, o, c, _ in (routed(t, gen, prof) for prof in profiles)]
        top_w, order, counts = routings[-1]  # the drift checks: the last layer's
        pairs = t * TOP_K
        shipped = moe_fp8.tiles_for(pairs, EXPERTS), moe_fp8.down_tiles_for(pairs, EXPERTS)
        regimes = {"gate_up": _regime(shipped[0]), "down": _regime(shipped[1])}
        call = partial(layered, [partial(moe_fp8.experts_pairs_fp8, x, o, c, w, q8) for w, o, c in routings])
        base = MoeTiles(
            gate_up=best["gate_up"].get(regimes["gate_up"], shipped[0].gate_up),
            down=best["down"].get(regimes["down"], shipped[1].down),
        )
        if args.sweep_every:
            base = sweep(rows, t, call, {"gate_up": "both", "down": "both"}, base)
        elif args.sweep_each or t in (800, 65536) or any(r not in best[k] for k, r in regimes.items()):
            base = sweep(rows, t, call, regimes, base)
        best["gate_up"][regimes["gate_up"]], best["down"][regimes["down"]] = base.gate_up, base.down
        bf16_call = partial(
            layered, [partial(moe.experts_pairs, x, o, c, w, gate_up, down) for w, o, c in routings]
        )
        variants = {
            "triton_fp8_best": partial(call, tiles=base),
            "triton_fp8_shipped": call,
            "cutlass_fp8": partial(layered, [partial(cutlass_fp8, x, w, o, c, q8) for w, o, c in routings]),
            "bf16_fused": bf16_call,
        }
        flops = 2.0 * t * TOP_K * HIDDEN * 3 * INTER * len(profiles)
        ref = bf16_call()
        got = call()
        spread = [round(float(c.max()) * EXPERTS / pairs, 2) for _, _, c in routings]
        row: dict[str, object] = {
            "kind": "layer", "tokens": t, "regime": regimes["gate_up"], "down_regime": regimes["down"],
            "layers": len(profiles), "busiest_over_mean": spread,
        }  # fmt: skip
        for name, fn in variants.items():
            us = graph_us(fn)
            nbytes = fp8_bytes * (2 if name == "bf16_fused" else 1)
            row[f"{name}_us"] = round(us, 1)
            row[f"{name}_weights_tb_s"] = round(nbytes / us / 1e6, 2)
            row[f"{name}_tflop_s"] = round(flops / us / 1e6, 1)
        inv = torch.empty_like(order)
        inv[order.long()] = torch.arange(order.numel(), device="cuda", dtype=order.dtype)
        row["triton_fp8_vs_bf16"] = round(rel(got, ref), 5)
        row["cutlass_fp8_vs_bf16"] = round(rel(variants["cutlass_fp8"]()[inv.long()], ref), 5)
        if t <= 4096:
            twin = moe_fp8.experts_pairs_fp8_reference(x, order, counts, top_w, q8)
            row["triton_fp8_vs_twin"] = round(rel(got, twin), 7)
        row["best_tiles"] = {k: asdict(v) for k, v in asdict_tiles(base).items()}
        emit(rows, **row)
        for scaling in (s for s in args.scalings.split(",") if s and s != moe_fp8.DOWN_SCALING):
            sc_call = partial(call, scaling=scaling)
            sc_best = base
            if t in (800, 65536) and not args.sweep_every:
                sc_best = sweep(rows, t, sc_call, {"down": regimes["down"]}, sc_best, scaling=scaling)
            us = graph_us(partial(sc_call, tiles=sc_best))
            sc_got = sc_call(tiles=sc_best)
            sc_row: dict[str, object] = {
                "kind": "scaling", "tokens": t, "scaling": scaling, "us": round(us, 1),
                "weights_tb_s": round(fp8_bytes / us / 1e6, 2), "tflop_s": round(flops / us / 1e6, 1),
                "vs_bf16": round(rel(sc_got, ref), 5), "down_tiles": asdict(sc_best.down),
            }  # fmt: skip
            if t <= 4096:
                twin = moe_fp8.experts_pairs_fp8_reference(x, order, counts, top_w, q8, scaling)
                sc_row["vs_twin"] = round(rel(sc_got, twin), 7)
            emit(rows, **sc_row)
        if t == 800:
            for c in _BF16_SMALL_DOWN:
                tiles = replace(moe.SMALL, down=_tiles(c))
                us = graph_us(partial(bf16_call, tiles=tiles))
                emit(rows, kind="bf16_small_down", tokens=t, tiles=list(c), us=round(us, 1))
    (out / "moe_fp8.jsonl").write_text("\n".join(rows) + "\n")
    tiles_best = {
        regime: {k: asdict(best[k].get(regime, getattr(shipped_m, k))) for k in ("gate_up", "down")}
        for regime, shipped_m in (("small", moe_fp8.SMALL), ("large", moe_fp8.LARGE))
    }
    (out / "tiles_best.json").write_text(json.dumps(tiles_best, indent=1))
    return 0


def asdict_tiles(m: MoeTiles) -> dict[str, Tiles]:
    return {"gate_up": m.gate_up, "down": m.down}


if __name__ == "__main__":
    raise SystemExit(main())
