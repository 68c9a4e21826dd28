"""One full-size MoE layer on the H200: the fused Triton expert kernels (`engine.kernels.moe`) against the
unfused
CUTLASS path, a sweep of tile shapes, and the attention kernels one lone request can use.

`python3 -m bench.moe_kernels --out DIR` builds one layer's experts (128 x (1,536 x 2,048 + 2,048 x 768),
random bf16, 1.2 GB, so every call reads them from HBM, not L2) and routes T tokens uniformly at random
(each token picks 8 distinct experts; more even than the engine's levelled routers, whose busiest expert
takes several times the mean: `bench.moe_fp8 --routes` draws from their profile). It prints, as JSON lines:

1. `sweep`: each candidate tile shape of each kernel, at every T, in microseconds (median of 20).
2. `layer`: the whole expert block per T (routing excluded, from the sorted pairs on): unfused (gather,
   CUTLASS gate/up, SwiGLU, CUTLASS down, combine) against fused (best shapes of the sweep, and the
   shapes `engine.kernels.moe` ships), with the weight-read rate and TFLOP/s, and max |diff| between them.
3. `attention`: one causal record of 896 tokens (32 q heads, 4 kv heads, 128 dims) through varlen
   FlashAttention and through dense SDPA per backend; 128 x 512 tokens through varlen FlashAttention
   and dense cuDNN.
4. `dense` (alone with `--dense-only`): the attention layer's dense GEMMs at each graph bucket's rows.
5. `packed_attention` (alone with `--packed-attention-only`): the fast path's Triton attention
   (`engine.kernels.attention`) over a sweep of launch shapes against varlen FlashAttention 2.

Writes `moe_kernels.jsonl` to `--out`. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

from bench.report import emit_line as emit
from bench.timing import graph_us
from engine.kernels import elementwise, moe
from engine.kernels.tiles import MoeTiles, Tiles

HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 128, 8


def random_experts(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One full-size layer's experts, random bf16 on CUDA: gate_up (E, 2I, H) and down (E, H, I)."""
    gate_up = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, device="cuda", generator=gen) / HIDDEN**0.5).bfloat16()
    down = (torch.randn(EXPERTS, HIDDEN, INTER, device="cuda", generator=gen) / INTER**0.5).bfloat16()
    return gate_up, down


def uniform_routing(t: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(top_w (T, k) float32 summing to 1 per token, top_i (T, k) int32) of uniform routing."""
    top_i = torch.rand(t, EXPERTS, generator=gen, device="cuda").argsort(dim=1)[:, :TOP_K].int()
    top_w = torch.rand(t, TOP_K, generator=gen, device="cuda")
    return top_w / top_w.sum(dim=1, keepdim=True), top_i.contiguous()


def profiled_routing(t: int, gen: torch.Generator, profile: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(top_w, top_i) as `uniform_routing`'s, but each token draws its k distinct experts with probabilities
    proportional to `profile` (E counts: how often one layer's routers picked each expert,
    `bench.routing.load_profiles`) plus one half (so an expert never seen there stays possible)."""
    if len(profile) != EXPERTS:
        raise ValueError(f"a routing profile has {EXPERTS} counts, not {len(profile)}")
    weights = torch.tensor(profile, dtype=torch.float32, device="cuda") + 0.5
    rows = weights.expand(t, EXPERTS).contiguous()
    top_i = torch.multinomial(rows, TOP_K, replacement=False, generator=gen).int()
    top_w = torch.rand(t, TOP_K, generator=gen, device="cuda")
    return top_w / top_w.sum(dim=1, keepdim=True), top_i.contiguous()


def routed(
    t: int, gen: torch.Generator, profile: list[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top_w (T, k) float32, order (T k,), counts (E,) int32, inv (T k,)) for uniform routing, or drawn
    from `profile` (`profiled_routing`)."""
    top_w, top_i = uniform_routing(t, gen) if profile is None else profiled_routing(t, gen, profile)
    flat = top_i.reshape(-1)
    order = torch.argsort(flat.to(torch.uint8))
    counts = torch.histc(flat, bins=EXPERTS, min=0, max=EXPERTS - 1).int()
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device="cuda")
    return top_w, order, counts, inv


def unfused(
    x: torch.Tensor,
    top_w: torch.Tensor,
    order: torch.Tensor,
    counts: torch.Tensor,
    inv: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
) -> torch.Tensor:
    """The fast path's bf16 expert block before `engine.kernels.moe` (as in
    `engine.model.decoder.PackedTextDecoder._moe`)."""
    offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
    xs = x.index_select(0, order // TOP_K)
    h = F.grouped_mm(xs, gate_up.transpose(-2, -1), offs=offs)
    a = elementwise.swiglu_weighted(h, top_w.reshape(-1)[order])
    y = F.grouped_mm(a, down.transpose(-2, -1), offs=offs)
    return elementwise.combine(y, inv, TOP_K)


_GATE_UP = (
    (64, 64, 64, 4, 4),
    (64, 64, 64, 4, 4, True),
    (64, 64, 64, 4, 5, True),
    (64, 128, 64, 4, 3, True),
    (64, 128, 64, 8, 4, True),
    (64, 64, 64, 4, 4, True, True),
    (128, 128, 64, 8, 3),
    (128, 128, 64, 8, 3, True),
    (128, 128, 64, 8, 4, True),
    (128, 64, 64, 8, 4, True),
    (128, 128, 64, 8, 3, True, True),
    (128, 128, 64, 8, 4, True, True),
    (128, 64, 64, 4, 4, True, True),
    (128, 64, 64, 8, 5, True),
    (256, 64, 64, 8, 3, True),
    (256, 64, 64, 8, 4, True),
    (128, 128, 32, 8, 6, True),
    (128, 128, 128, 8, 2, True),
)
_DOWN = (
    (64, 128, 64, 4, 4),
    (64, 128, 64, 4, 4, True),
    (64, 256, 64, 4, 3, True),
    (64, 256, 64, 8, 4, True),
    (64, 128, 64, 4, 5, True),
    (64, 128, 64, 4, 4, True, True),
    (128, 256, 64, 8, 3),
    (128, 256, 64, 8, 3, True),
    (128, 256, 64, 8, 4, True),
    (128, 128, 64, 8, 4, True),
    (128, 256, 64, 8, 3, True, True),
    (128, 128, 64, 4, 4, True, True),
    (256, 128, 64, 8, 3, True),
    (256, 128, 64, 8, 4, True),
    (128, 256, 32, 8, 6, True),
    (128, 256, 128, 8, 2, True),
)


def candidates(kind: str) -> list[Tiles]:
    """Tile shapes to try for `kind` ("gate_up" or "down"): (block_m, block_n, block_k, warps, stages,
    tma, ws)."""
    return [Tiles(*t) for t in (_GATE_UP if kind == "gate_up" else _DOWN)]


def useful(tiles: Tiles, tokens: int) -> bool:
    """64-row tiles for batches up to 16,384 tokens, 128-row tiles from 4,096 tokens."""
    return not ((tiles.block_m <= 64 and tokens > 16384) or (tiles.block_m >= 128 and tokens < 4096))


def kernel_info() -> dict[str, str]:
    """The `info` row of a kernel bench: torch and Triton versions and the GPU."""
    import triton

    return {
        "kind": "info",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "gpu": torch.cuda.get_device_name(),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--tokens", default="800,4096,16384,65536")
    p.add_argument("--max-candidates", type=int, default=60)
    p.add_argument("--attention-only", action="store_true", help="skip the expert kernels")
    p.add_argument("--experts-only", action="store_true", help="skip the attention kernels")
    p.add_argument(
        "--dense-only",
        action="store_true",
        help="only the attention layer's dense GEMMs (cuBLAS) at the token counts graph buckets replay",
    )
    p.add_argument(
        "--packed-attention-only",
        action="store_true",
        help="only the sweep of the packed Triton attention against varlen FlashAttention",
    )
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []
    emit(rows, **kernel_info())
    torch.manual_seed(0)
    gen = torch.Generator(device="cuda").manual_seed(0)
    if args.dense_only:
        with torch.inference_mode():
            dense_gemms(rows, gen)
        (out / "moe_kernels.jsonl").write_text("\n".join(rows) + "\n")
        return 0
    if args.packed_attention_only:
        with torch.inference_mode():
            packed_attention_sweep(rows, gen)
        (out / "moe_kernels.jsonl").write_text("\n".join(rows) + "\n")
        return 0
    with torch.inference_mode():
        gate_up = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, device="cuda") * 0.02).bfloat16()
        down = (torch.randn(EXPERTS, HIDDEN, INTER, device="cuda") * 0.02).bfloat16()
        weight_bytes = (gate_up.numel() + down.numel()) * 2
        tokens = [] if args.attention_only else [int(t) for t in args.tokens.split(",")]
        cases = {}
        for t in tokens:
            x = torch.randn(t, HIDDEN, device="cuda").bfloat16()
            cases[t] = (x, *routed(t, gen))
        # 1. the sweep, per kernel: the other kernel's shape fixed at the shipped one
        best: dict[tuple[str, int], tuple[float, Tiles]] = {}
        for kind in ("gate_up", "down"):
            for tiles in candidates(kind)[: args.max_candidates]:
                for t in (t for t in tokens if useful(tiles, t)):
                    x, top_w, order, counts, _ = cases[t]
                    shipped = moe.tiles_for(t * TOP_K, EXPERTS)
                    pair = (
                        MoeTiles(tiles, shipped.down)
                        if kind == "gate_up"
                        else MoeTiles(shipped.gate_up, tiles)
                    )
                    try:
                        us_all = graph_us(
                            partial(moe.experts_forward, x, order, counts, top_w, gate_up, down, pair), 10
                        )
                    except Exception as exc:  # a shape Triton cannot build is skipped
                        emit(rows, kind="sweep_error", kernel=kind, tiles=repr(tiles), error=str(exc)[:200])
                        break
                    emit(
                        rows,
                        kind="sweep",
                        kernel=kind,
                        tokens=t,
                        tiles=list(_astuple(tiles)),
                        us=round(us_all, 1),
                    )
                    if (kind, t) not in best or us_all < best[(kind, t)][0]:
                        best[(kind, t)] = (us_all, tiles)
        # 2. the whole block per T
        for t in tokens:
            x, top_w, order, counts, inv = cases[t]
            ref = unfused(x, top_w, order, counts, inv, gate_up, down)
            us_ref = graph_us(partial(unfused, x, top_w, order, counts, inv, gate_up, down))
            tuned = MoeTiles(best[("gate_up", t)][1], best[("down", t)][1])
            row: dict[str, object] = {"kind": "layer", "tokens": t, "unfused_us": round(us_ref, 1)}
            for name, pair in (("shipped", moe.tiles_for(t * TOP_K, EXPERTS)), ("best", tuned)):
                got = moe.experts_forward(x, order, counts, top_w, gate_up, down, pair)
                us = graph_us(partial(moe.experts_forward, x, order, counts, top_w, gate_up, down, pair))
                flops = 2.0 * t * TOP_K * 3 * HIDDEN * INTER
                row |= {
                    f"{name}_us": round(us, 1),
                    f"{name}_tiles": [list(_astuple(pair.gate_up)), list(_astuple(pair.down))],
                    f"{name}_weight_tb_s": round(weight_bytes / us / 1e6, 2),
                    f"{name}_tflop_s": round(flops / us / 1e6, 1),
                    f"{name}_max_abs_diff": float((got.float() - ref.float()).abs().max()),
                    f"{name}_ref_max_abs": float(ref.float().abs().max()),
                }
            row["unfused_weight_tb_s"] = round(weight_bytes / us_ref / 1e6, 2)
            emit(rows, **row)
        for t in (t for t in tokens if t >= 4096):
            x, *routing = cases[t]
            expert_ceiling(rows, t, x, tuple(routing), (gate_up, down))
        # 3. attention for one 896-token record, and for packed batches
        if not args.experts_only:
            attention(rows)
            packed_attention_sweep(rows, gen)
    (out / "moe_kernels.jsonl").write_text("\n".join(rows) + "\n")
    return 0


def _astuple(t: Tiles) -> tuple[int | bool, ...]:
    return (t.block_m, t.block_n, t.block_k, t.warps, t.stages, t.tma, t.ws)


def attention(rows: list[str]) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.varlen import varlen_attn

    n, hq, hk, d = 896, 32, 4, 128
    q = torch.randn(n, hq, d, device="cuda").bfloat16()
    k = torch.randn(n, hk, d, device="cuda").bfloat16()
    v = torch.randn(n, hk, d, device="cuda").bfloat16()
    cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
    ref = varlen_attn(q, k, v, cu, cu, n, n, window_size=(-1, 0))
    assert isinstance(ref, torch.Tensor)
    us = graph_us(lambda: varlen_attn(q, k, v, cu, cu, n, n, window_size=(-1, 0)))
    emit(rows, kind="attention", kernel="varlen_flash", tokens=n, us=round(us, 1))
    qd, kd, vd = (t.transpose(0, 1)[None] for t in (q, k, v))  # (1, heads, n, d)
    kx, vx = (t.repeat_interleave(hq // hk, dim=1) for t in (kd, vd))
    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            got = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, enable_gqa=True)
            us = graph_us(lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, enable_gqa=True))
        diff = float((got[0].transpose(0, 1).float() - ref.float()).abs().max())
        emit(rows, kind="attention", kernel="cudnn_gqa", tokens=n, us=round(us, 1), max_abs_diff=diff)
    except RuntimeError as exc:
        emit(rows, kind="attention_error", kernel="cudnn_gqa", error=str(exc)[:200])
    before = torch._C._get_sdp_priority_order()
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION], set_priority=True):
        pass
    emit(rows, kind="sdpa_priority", before=before, after_set_priority=torch._C._get_sdp_priority_order())
    packed_batch(rows)
    for name, backend in (
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ):
        try:
            with sdpa_kernel([backend]):
                got = F.scaled_dot_product_attention(qd, kx, vx, is_causal=True)
                us = graph_us(lambda: F.scaled_dot_product_attention(qd, kx, vx, is_causal=True))
            diff = float((got[0].transpose(0, 1).float() - ref.float()).abs().max())
            emit(rows, kind="attention", kernel=name, tokens=n, us=round(us, 1), max_abs_diff=diff)
        except RuntimeError as exc:
            emit(rows, kind="attention_error", kernel=name, error=str(exc)[:200])


def packed_batch(rows: list[str], records: int = 128, n: int = 512) -> None:
    """128 records of 512 tokens: varlen FlashAttention on the packed axis against dense causal cuDNN
    on a (records, heads, n, d) batch (equal lengths: no padding), kv heads repeated or grouped."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.varlen import varlen_attn

    hq, hk, d = 32, 4, 128
    t = records * n
    q = torch.randn(t, hq, d, device="cuda").bfloat16()
    k = torch.randn(t, hk, d, device="cuda").bfloat16()
    v = torch.randn(t, hk, d, device="cuda").bfloat16()
    cu = torch.arange(0, t + 1, n, dtype=torch.int32, device="cuda")
    us = graph_us(lambda: varlen_attn(q, k, v, cu, cu, n, n, window_size=(-1, 0)), per_graph=2)
    emit(rows, kind="attention", kernel="varlen_flash", records=records, tokens=n, us=round(us, 1))
    qd = q.view(records, n, hq, d).transpose(1, 2)
    kd = k.view(records, n, hk, d).transpose(1, 2)
    vd = v.view(records, n, hk, d).transpose(1, 2)
    for name, gqa in (("cudnn_gqa", True), ("cudnn_repeat", False)):
        try:
            kx = kd if gqa else kd.repeat_interleave(hq // hk, dim=1)
            vx = vd if gqa else vd.repeat_interleave(hq // hk, dim=1)
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                call = partial(F.scaled_dot_product_attention, qd, kx, vx, is_causal=True, enable_gqa=gqa)
                us = graph_us(call, per_graph=2)
            emit(rows, kind="attention", kernel=name, records=records, tokens=n, us=round(us, 1))
        except RuntimeError as exc:
            emit(rows, kind="attention_error", kernel=name, error=str(exc)[:200])


def expert_ceiling(
    rows: list[str],
    t: int,
    x: torch.Tensor,
    routing: tuple[torch.Tensor, ...],
    weights: tuple[torch.Tensor, ...],
) -> None:
    """Each fused expert kernel's own GPU time (torch profiler, shipped tiles) at `t` tokens, against
    cuBLAS batched GEMMs of the same shapes with the rows split evenly over the experts (no gather, no
    epilogue): what the card gives these GEMM shapes at the clocks of this run."""
    from torch.profiler import ProfilerActivity, profile

    top_w, order, counts, _ = routing
    gate_up, down = weights
    m = t * TOP_K // EXPERTS
    call = partial(moe.experts_pairs, x, order, counts, top_w, gate_up, down)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    calls = 10
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    fused = {"gate_up": 0.0, "down": 0.0}
    for ev in prof.key_averages():
        for name in fused:
            if f"_moe_{name}" in ev.key:
                fused[name] += float(ev.device_time_total) / calls
    a1 = torch.randn(EXPERTS, m, HIDDEN, device="cuda").bfloat16()
    a2 = torch.randn(EXPERTS, m, INTER, device="cuda").bfloat16()
    bmm = {
        "gate_up": graph_us(partial(torch.bmm, a1, gate_up.transpose(1, 2)), per_graph=2),
        "down": graph_us(partial(torch.bmm, a2, down.transpose(1, 2)), per_graph=2),
    }
    flops = {"gate_up": 2.0 * t * TOP_K * HIDDEN * 2 * INTER, "down": 2.0 * t * TOP_K * INTER * HIDDEN}
    row: dict[str, object] = {"kind": "expert_ceiling", "tokens": t, "rows_per_expert": m}
    for name in fused:
        row[f"{name}_fused_us"] = round(fused[name], 1)
        row[f"{name}_fused_tflop_s"] = round(flops[name] / fused[name] / 1e6, 1)
        row[f"{name}_cublas_bmm_us"] = round(bmm[name], 1)
        row[f"{name}_cublas_bmm_tflop_s"] = round(flops[name] / bmm[name] / 1e6, 1)
    emit(rows, **row)


DENSE_TOKENS = (512, 576, 640, 704, 768, 800, 807, 832, 864, 896, 960, 1024, 1152, 1280)
"""Token counts (GEMM rows) the dense GEMMs are timed at: the graph buckets and a lone request's 807."""


def dense_gemms(rows: list[str], gen: torch.Generator) -> None:
    """The fast path's per-layer dense GEMMs through `F.linear` (cuBLAS picks the kernel per shape):
    fused QKV (2,048 -> 5,120), the output projection (4,096 -> 2,048) and the router (2,048 -> 128)."""
    shapes = {"qkv": (HIDDEN, 5120), "o_proj": (4096, HIDDEN), "router": (HIDDEN, EXPERTS)}
    weights = {
        name: torch.randn(n, k, device="cuda", generator=gen).bfloat16() for name, (k, n) in shapes.items()
    }
    for t in DENSE_TOKENS:
        row: dict[str, object] = {"kind": "dense", "tokens": t}
        for name, w in weights.items():
            x = torch.randn(t, w.shape[1], device="cuda", generator=gen).bfloat16()
            us = graph_us(partial(F.linear, x, w))
            row[f"{name}_us"] = round(us, 1)
            row[f"{name}_tflop_s"] = round(2.0 * t * w.numel() / us / 1e6, 1)
        emit(rows, **row)


ATTENTION_PACKS = {
    "128x512": [512] * 128,
    "one896": [896],
    "drift320-704": [320 + (i * 37) % 385 for i in range(128)],
    "16x807": [807] * 16,
}
"""Record lengths of the packs the attention sweep times: the throughput bench's batch, one lone request,
lengths spread as `bench.experts --drift 192` spreads them, and a small batch of long requests."""
SWEEP_PACKS = ("128x512", "one896")
"""The packs every candidate shape is timed on (the others: the shipped shape only)."""


def packed_attention_sweep(rows: list[str], gen: torch.Generator) -> None:
    """`engine.kernels.attention`'s Triton kernel over a sweep of launch shapes against varlen
    FlashAttention 2, on the packs of `ATTENTION_PACKS` (32 q heads, 4 kv heads, 128 dims): microseconds
    per call and max |diff| from FlashAttention."""
    import itertools

    from torch.nn.attention.varlen import varlen_attn

    from engine.kernels import attention
    from engine.kernels.tiles import AttentionTiles

    hq, hk, d = 32, 4, 128
    # The second sweep, around the first's best (64, 32, 4 warps, 3 stages, group 8 of 36 shapes:
    # docs/bench/packed_attention_sweep1.jsonl): smaller blocks, deeper pipelines, 4 heads per program.
    shapes = [
        AttentionTiles(m, n, 4, s, 8) for m, n, s in itertools.product((32, 64, 128), (16, 32, 64), (3, 4))
    ]
    shapes += [AttentionTiles(64, 32, 4, 3, 4), AttentionTiles(128, 32, 8, 3, 8)]
    for name, lengths in ATTENTION_PACKS.items():
        t, longest = sum(lengths), max(lengths)
        q = torch.randn(t, hq, d, device="cuda", generator=gen).bfloat16()
        k = torch.randn(t, hk, d, device="cuda", generator=gen).bfloat16()
        v = torch.randn(t, hk, d, device="cuda", generator=gen).bfloat16()
        cu = torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)
        per_graph = 2 if t > 10_000 else 5
        ref = varlen_attn(q, k, v, cu, cu, longest, longest, window_size=(-1, 0))
        assert isinstance(ref, torch.Tensor)
        flash = partial(varlen_attn, q, k, v, cu, cu, longest, longest, window_size=(-1, 0))
        us_ref = graph_us(flash, per_graph=per_graph)
        flops = sum(2.0 * 2 * hq * d * n * (n + 1) / 2 for n in lengths)
        emit(
            rows,
            kind="packed_attention",
            kernel="varlen_flash",
            pack=name,
            us=round(us_ref, 1),
            tflop_s=round(flops / us_ref / 1e6, 1),
        )
        for tiles in shapes if name in SWEEP_PACKS else [attention.TILES]:
            call = partial(attention.attention_triton, q, k, v, cu, longest, tiles)
            try:
                got = call()
                us = graph_us(call, per_graph=per_graph)
            except Exception as exc:  # a shape Triton cannot build (shared memory) is skipped
                emit(rows, kind="packed_attention_error", pack=name, tiles=repr(tiles), error=str(exc)[:200])
                continue
            emit(
                rows,
                kind="packed_attention",
                kernel="triton",
                pack=name,
                tiles=[tiles.block_m, tiles.block_n, tiles.warps, tiles.stages, tiles.group],
                us=round(us, 1),
                tflop_s=round(flops / us / 1e6, 1),
                max_abs_diff=float((got.float() - ref.float()).abs().max()),
            )


if __name__ == "__main__":
    raise SystemExit(main())
