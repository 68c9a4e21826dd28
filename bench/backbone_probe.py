"""Probe: plain transformers backbone vs the packed fast path on the full-size thinker (H200 only).

Prints one JSON line per measurement and writes them to $OUT/probe.jsonl when OUT is set. Not a test.
Run: python -m bench.backbone_probe [--layers N] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from bench.fullsize import build_text_model
from bench.timing import event_ms
from engine.model.decoder import PackedInputs, PackedTextDecoder
from engine.model.packed_ids import PackedIds, packed_inputs

RESULTS: list[dict[str, Any]] = []


def emit(**row: Any) -> None:
    RESULTS.append(row)
    print(json.dumps(row), flush=True)


def packed_ids(ids: torch.Tensor, lengths: list[int]) -> PackedIds:
    flat = torch.cat([ids[i, :n] for i, n in enumerate(lengths)])  # (T,)
    pos = torch.cat([torch.arange(n, device="cuda") for n in lengths])  # (T,)
    return PackedIds(flat, pos[None].expand(3, -1), tuple(lengths))


def packed(model: Any, ids: torch.Tensor, lengths: list[int]) -> PackedInputs:
    return packed_inputs(model.embed_tokens, packed_ids(ids, lengths))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--shapes", default="1x800,8x512,64x512,16x2048,1x3400")
    ap.add_argument("--no-hf", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = build_text_model(args.layers)
    emit(
        kind="info",
        torch=torch.__version__,
        gpu=torch.cuda.get_device_name(),
        params_b=sum(p.numel() for p in model.parameters()) / 1e9,
        mem_gb=torch.cuda.memory_allocated() / 1e9,
    )
    fast = PackedTextDecoder(model)
    vocab = model.config.vocab_size

    with torch.inference_mode():
        # Correctness: fast path on a mixed pack vs transformers on each record alone.
        lengths = [37, 512, 200, 800]
        ids = torch.randint(0, vocab, (len(lengths), max(lengths)), device="cuda")
        hf_alone = [model(input_ids=ids[i : i + 1, :n]).last_hidden_state[0] for i, n in enumerate(lengths)]
        out = fast(packed(model, ids, lengths))
        parts = torch.split(out, lengths)
        emit(
            kind="check",
            what="fast_pack_vs_hf_alone",
            rel_err=[rel(p, h) for p, h in zip(parts, hf_alone, strict=True)],
        )
        alone = [fast(packed(model, ids[i : i + 1], [n])) for i, n in enumerate(lengths)]
        emit(
            kind="check",
            what="fast_pack_vs_fast_alone",
            rel_err=[rel(p, h) for p, h in zip(parts, alone, strict=True)],
        )

        for b, n in [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]:
            ids = torch.randint(0, vocab, (b, n), device="cuda")
            hf_ms = [float("nan")] if args.no_hf else event_ms(partial(model, input_ids=ids))
            p = packed(model, ids, [n] * b)
            fast_ms = event_ms(partial(fast, p))
            torch.cuda.reset_peak_memory_stats()
            fast(p)
            peak = torch.cuda.max_memory_allocated() / 1e9
            for name, ms in (("hf_sdpa_grouped_mm", hf_ms), ("fast_packed", fast_ms)):
                if args.no_hf and name.startswith("hf"):
                    continue
                med = statistics.median(ms)
                emit(
                    kind="time",
                    impl=name,
                    batch=b,
                    length=n,
                    ms_p50=round(med, 2),
                    ms_all=[round(x, 2) for x in ms],
                    tok_s=round(b * n / med * 1000),
                    peak_gb=round(peak, 1) if name == "fast_packed" else None,
                )

        if args.graph:
            from engine.model.graphs import GraphedDecoder

            graphed = GraphedDecoder(fast, buckets=(512, 1024, 2048, 4096), max_records=8)
            for lengths in ([800], [300, 200], [512] * 8):
                ids = torch.randint(0, vocab, (len(lengths), max(lengths)), device="cuda")
                batch = packed_ids(ids, lengths)
                try:
                    ms = event_ms(partial(graphed.run, batch), warmup=3, reps=20)
                    out = graphed.run(batch)
                    ref = fast(packed_inputs(model.embed_tokens, batch))
                    emit(
                        kind="time",
                        impl="fast_packed_cudagraph",
                        lengths=lengths,
                        ms_p50=round(statistics.median(ms), 2),
                        ms_p99=round(max(ms), 2),
                        tok_s=round(sum(lengths) / statistics.median(ms) * 1000),
                        rel_err_vs_eager=rel(out, ref),
                    )
                except Exception as exc:  # report and go on: a probe
                    emit(kind="error", what="cudagraph", error=repr(exc)[:800])
        # Fused kernels against their PyTorch twins, on fresh random inputs.
        from engine.kernels import elementwise, moe

        x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
        d = torch.randn_like(x)
        w = torch.rand(2048, device="cuda", dtype=torch.bfloat16) + 0.5
        y, normed = elementwise.add_rms_norm(x, d, w, 1e-6)
        ry = x + d
        emit(
            kind="check",
            what="kernel_add_rms_norm",
            rel_err=[rel(y, ry), rel(normed, elementwise.rms_norm_reference(ry, w, 1e-6))],
        )
        h = torch.randn(70000, 1536, device="cuda", dtype=torch.bfloat16)
        rw = torch.rand(70000, device="cuda")
        g, u = h.float().chunk(2, dim=-1)
        emit(
            kind="check",
            what="kernel_swiglu",
            rel_err=rel(elementwise.swiglu_weighted(h, rw), torch.nn.functional.silu(g) * u * rw[:, None]),
        )
        yy = torch.randn(8000 * 8, 2048, device="cuda", dtype=torch.bfloat16)
        inv = torch.randperm(8000 * 8, device="cuda")
        ref = yy.float()[inv].view(8000, 8, -1).sum(1)
        emit(kind="check", what="kernel_combine", rel_err=rel(elementwise.combine(yy, inv, 8), ref))
        # Attention backends on a 64 x 512 pack: FlashAttention varlen vs cuDNN ragged.
        from torch.nn.attention.varlen import varlen_attn

        t = 64 * 512
        q = torch.randn(t, 32, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(t, 4, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(t, 4, 128, device="cuda", dtype=torch.bfloat16)
        cu = torch.arange(0, t + 1, 512, device="cuda", dtype=torch.int32)
        fa = varlen_attn(q, k, v, cu, cu, 512, 512, window_size=(-1, 0))
        assert isinstance(fa, torch.Tensor)
        ms = event_ms(lambda: varlen_attn(q, k, v, cu, cu, 512, 512, window_size=(-1, 0)), reps=10)
        emit(kind="time", impl="attn_flash_varlen_64x512", ms_p50=round(statistics.median(ms), 3))
        qb = q.view(64, 512, 32, 128).transpose(1, 2)
        kb = k.view(64, 512, 4, 128).transpose(1, 2)
        vb = v.view(64, 512, 4, 128).transpose(1, 2)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
            try:
                with sdpa_kernel(be):
                    fn = partial(
                        torch.nn.functional.scaled_dot_product_attention,
                        qb,
                        kb,
                        vb,
                        is_causal=True,
                        enable_gqa=True,
                    )
                    o: torch.Tensor = fn()
                    ms = event_ms(fn, reps=10)
                emit(
                    kind="time",
                    impl=f"attn_sdpa_{be.name}_64x512",
                    ms_p50=round(statistics.median(ms), 3),
                    rel_err=rel(o.transpose(1, 2).reshape(t, 32, 128), fa),
                )
            except Exception as exc:
                emit(kind="error", what=f"sdpa_{be.name}", error=repr(exc)[:300])
        # cuDNN ragged (packed, GQA) attention against FlashAttention varlen on mixed record lengths.
        lens = [37, 512, 200, 800, 3000, 1, 450]
        tm = sum(lens)
        cm = torch.tensor([0, *lens], device="cuda").cumsum(0).to(torch.int32)
        qm, km, vm = (torch.randn(tm, h, 128, device="cuda", dtype=torch.bfloat16) for h in (32, 4, 4))
        ref_m = varlen_attn(qm, km, vm, cm, cm, max(lens), max(lens), window_size=(-1, 0))
        assert isinstance(ref_m, torch.Tensor)
        calls: tuple[tuple[str, Callable[[], torch.Tensor]], ...] = (
            (
                "attn_cudnn_ragged_64x512",
                lambda: torch.ops.aten._cudnn_attention_forward(
                    q, k, v, None, cu, cu, 512, 512, False, 0.0, True
                )[0],
            ),
            (
                "attn_cudnn_ragged_mixed",
                lambda: torch.ops.aten._cudnn_attention_forward(
                    qm, km, vm, None, cm, cm, max(lens), max(lens), False, 0.0, True
                )[0],
            ),
        )
        for name, call in calls:
            try:
                o = call()
                ms = event_ms(call, reps=10)
                ref_o = fa if name.endswith("64x512") else ref_m
                emit(kind="time", impl=name, ms_p50=round(statistics.median(ms), 3), rel_err=rel(o, ref_o))
            except Exception as exc:
                emit(kind="error", what=name, error=repr(exc)[:500])
        ms = event_ms(
            lambda: varlen_attn(qm, km, vm, cm, cm, max(lens), max(lens), window_size=(-1, 0)), reps=10
        )
        emit(kind="time", impl="attn_flash_varlen_mixed", ms_p50=round(statistics.median(ms), 3))
        # MoE routing: fused Triton top-k against softmax + torch.topk.
        logits = torch.randn(64 * 512, 128, device="cuda", dtype=torch.bfloat16)

        def torch_route() -> tuple[torch.Tensor, torch.Tensor]:
            pr = torch.softmax(logits, dim=-1, dtype=torch.float32)
            tw, ti = torch.topk(pr, 8, dim=-1)
            return tw / tw.sum(dim=-1, keepdim=True), ti

        rw_ref, ri_ref = torch_route()
        rw, ri = moe.route_topk(logits, 8, True)
        emit(
            kind="check",
            what="kernel_route_topk",
            ids_equal=bool((ri.long() == ri_ref).all()),
            max_abs_w=float((rw - rw_ref).abs().max()),
        )
        for name, fn_r in (
            ("route_torch", torch_route),
            ("route_triton", partial(moe.route_topk, logits, 8, True)),
        ):
            ms = event_ms(fn_r, reps=20)
            emit(kind="time", impl=f"{name}_32768x128", ms_p50=round(statistics.median(ms), 3))
        # Sorting expert ids: key width decides the radix passes.
        flat = torch.randint(0, 128, (262144,), device="cuda")
        for dt in (torch.int64, torch.int32, torch.int16, torch.uint8):
            keys = flat.to(dt)
            ms = event_ms(partial(torch.argsort, keys), warmup=2, reps=10)
            emit(kind="time", impl=f"argsort_{dt}", ms_p50=round(statistics.median(ms), 3))

        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            for b, n in [(64, 512)]:
                ids = torch.randint(0, vocab, (b, n), device="cuda")
                p = packed(model, ids, [n] * b)
                fast(p)
                with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                    fast(p)
                    torch.cuda.synchronize()
                table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
                print(table, flush=True)
                if os.environ.get("OUT"):
                    with open(os.path.join(os.environ["OUT"], f"profile_fast_{b}x{n}.txt"), "w") as fh:
                        fh.write(table)
                if args.no_hf:
                    continue
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    model(input_ids=ids)
                    torch.cuda.synchronize()
                table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
                print(table, flush=True)
                if os.environ.get("OUT"):
                    with open(os.path.join(os.environ["OUT"], f"profile_hf_{b}x{n}.txt"), "w") as fh:
                        fh.write(table)

    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "probe.jsonl"), "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
