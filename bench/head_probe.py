"""`python3 -m bench.head_probe`: the joint schema head alone on the GPU, eager and under `torch.compile`.

A lone request's head ran 236 kernels in 1.17 ms after the decoder's last one (863 us of them busy;
BENCHMARKS.md, "Engine, round ten"): launch-bound work on a few rows. This probe builds the full-size head
(`JointHeadConfig(hidden_size=2048)`, random bf16 weights) and a lexical table of the release's vocabulary,
and times `JointSchemaHead.forward` on B synthetic records of about 800 tokens each (3 questions with 6, 4
and 2 options; lengths differ per record, so a batch takes the masked attentions) the way
`ClefOmniModel.forward_probabilities` runs it (inference mode, the memory-efficient SDPA kernel), eagerly
and compiled by inductor (`dynamic=True`); `--modes eager` skips the compile.

One JSON line per (mode, B): ms per call back to back (CUDA events over 30 calls, median of 5 rounds: the
host's pace), GPU ms per call (launched behind a GPU sleep: the GPU's own time), CUDA kernels per call
(profiler; the kernels by GPU time in `head_profile_<mode>_<B>.txt`), the first call's seconds (the
compile), the largest |difference| of the compiled probabilities from the eager ones, and of the first
record's probabilities from those of B = 1 (the first B given).
Writes `head_probe.jsonl` to `--out`. A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.autograd import DeviceType  # type: ignore[attr-defined]
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from bench.fullsize import randomize_
from bench.report import emit_line as emit
from bench.report import start
from bench.timing import timing_event
from engine.batching.collate import collate
from engine.batching.spans import SpanIndex
from engine.model.head import JointHeadConfig, JointSchemaHead
from engine.types import EncodedRequest

VOCAB = 152_064
_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def record(tokens: int) -> EncodedRequest:
    """A synthetic record of `tokens` tokens: the state, then 3 questions of 6, 4 and 2 options at its end."""
    base = tokens - 200
    q_spans = ((base, base + 4), (base + 60, base + 63), (base + 120, base + 123))
    o_spans = (
        tuple((base + 8 + 7 * j, base + 12 + 7 * j) for j in range(6)),
        tuple((base + 68 + 6 * j, base + 71 + 6 * j) for j in range(4)),
        tuple((base + 128 + 6 * j, base + 131 + 6 * j) for j in range(2)),
    )
    ids = tuple(1000 + (i * 7919) % 150_000 for i in range(tokens))
    return EncodedRequest(
        input_ids=ids,
        question_ids=("department", "urgency", "outage"),
        question_types=(1, 2, 0),
        question_spans=q_spans,
        option_spans=o_spans,
        state_truncated=False,
        media=None,
        media_span=None,
    )


def ms_per_call(fn: Callable[[], object], calls: int = 30, rounds: int = 5) -> float:
    """Median over `rounds` of the mean ms of `calls` back-to-back calls (CUDA events)."""
    out = []
    for _ in range(rounds):
        start, end = timing_event(), timing_event()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        out.append(float(start.elapsed_time(end)) / calls)
    return float(statistics.median(out))


def gpu_ms(fn: Callable[[], object], calls: int = 5) -> float:
    """GPU ms of one call with its launches queued ahead: the calls are launched behind a ~100 ms GPU sleep,
    so launch gaps are the stream's own and not the host's pace."""
    start, end = timing_event(), timing_event()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / calls


def kernels_per_call(fn: Callable[[], object], table: Path | None = None) -> int:
    """CUDA kernels (and memsets, copies) the profiler sees in one call; with `table`, the call's kernels
    by GPU time are written there."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    if table is not None:
        table.write_text(prof.key_averages().table(sort_by="cuda_time_total", row_limit=60))
    return len([e for e in prof.events() if e.device_type == DeviceType.CUDA])


def fullsize_head() -> tuple[JointSchemaHead, torch.Tensor]:
    """The full-size head on the GPU in bf16 (random weights, seeds 0 and 1) and a lexical table (V, 2048)."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        head = JointSchemaHead(JointHeadConfig(hidden_size=2048)).to(torch.bfloat16).eval()
        table = (0.02 * torch.randn(VOCAB, 2048)).bfloat16()
    randomize_(head, seed=1)
    return head, table


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--records", default="1,4,16")
    p.add_argument("--modes", default="eager,compiled", help="eager, compiled or both (compiling is slow)")
    args, out, rows = start(p)
    emit(rows, kind="info", torch=torch.__version__, gpu=torch.cuda.get_device_name())
    head, table = fullsize_head()
    modes: dict[str, Callable[..., torch.Tensor]] = {}
    for name in args.modes.split(","):
        if name not in ("eager", "compiled"):
            p.error(f"--modes: unknown mode {name!r}")
        modes[name] = head if name == "eager" else torch.compile(head, dynamic=True)
    first_record: dict[str, torch.Tensor] = {}
    sizes = [int(v) for v in args.records.split(",")]
    hidden_all = torch.randn(sum(807 - 37 * i for i in range(max(sizes))), 2048, device="cuda").bfloat16()
    for b in sizes:
        batch = collate([record(807 - 37 * i) for i in range(b)])
        index: SpanIndex = batch.index.map_tensors(lambda t: t.to("cuda"))
        hidden = hidden_all[: sum(batch.lengths)]  # record 0's rows are the same in every batch
        results: dict[str, torch.Tensor] = {}
        for mode, module in modes.items():

            def call(
                m: Callable[..., torch.Tensor] = module, h: torch.Tensor = hidden, i: SpanIndex = index
            ) -> torch.Tensor:
                with torch.inference_mode(), sdpa_kernel(_BACKENDS):
                    return m(h, table, i)

            t0 = time.perf_counter()
            results[mode] = call()
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            for _ in range(3):
                call()
            line: dict[str, object] = {
                "kind": "head",
                "mode": mode,
                "records": b,
                "tokens": sum(batch.lengths),
                "ms": round(ms_per_call(call), 4),
                "gpu_ms": round(gpu_ms(call), 4),
                "kernels": kernels_per_call(call, out / f"head_profile_{mode}_{b}.txt"),
                "first_call_s": round(first_s, 2),
            }
            if mode != "eager" and "eager" in results:
                line["max_abs_dp_vs_eager"] = float((results[mode] - results["eager"]).abs().max())
            alone = first_record.setdefault(mode, results[mode])  # record 0 of every batch is the same record
            line["record0_alone_vs_batch"] = float((results[mode][: alone.numel()] - alone).abs().max())
            emit(rows, **line)
    (out / "head_probe.jsonl").write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
