"""`python3 -m bench.staging_probe`: does the joint head's host time depend on how its batch's span index was
copied to the GPU?

`ModelBatch.to` puts a batch's text tensors in one pinned byte buffer (every dtype's run 16-byte aligned) and
copies it once (`engine.batching.collate._to_device_packed`); before round twenty-one each dtype had a buffer
of its own. On two H100 hosts the bench's `head` stage was slower in the processes of the new tree, along
with stages the change never touched (`prepare`), so the hosts' noise and the layout could not be told apart.

This probe times both in one process, alternately: the full-size head (`bench.head_probe`'s set-up, random
bf16 weights) on one synthetic 807-token record, its index either a view of `ModelBatch.to("cuda")`'s one
buffer ("packed") or each tensor copied on its own ("apart", an allocation each, the most separate layout).
Per layout, `--rounds` rounds of `bench.head_probe.ms_per_call` (30 back-to-back calls, the host's pace), and
`ModelBatch.to` itself against per-tensor copies (median of 10 `bench.timing.synced_ms` calls a round).
Prints JSON lines and writes `staging_probe.jsonl` to `--out`. A benchmark: it asserts nothing; `max_abs_diff`
says whether both layouts give the head the same bits.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable

import torch
from torch.nn.attention import sdpa_kernel

from bench.head_probe import _BACKENDS, fullsize_head, ms_per_call, record
from bench.report import emit_line as emit
from bench.report import start
from bench.timing import synced_ms
from engine.batching.collate import ModelBatch, collate
from engine.batching.spans import SpanIndex


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--rounds", type=int, default=20)
    args, out, rows = start(p)
    emit(rows, kind="info", torch=torch.__version__, gpu=torch.cuda.get_device_name())
    head, table = fullsize_head()
    host: ModelBatch = collate([record(807)])
    hidden = torch.randn(host.num_tokens, 2048, device="cuda").bfloat16()
    layouts: dict[str, Callable[[], SpanIndex]] = {
        "packed": lambda: host.to("cuda").index,
        "apart": lambda: host.index.map_tensors(lambda t: t.to("cuda")),
    }
    indexes = {name: make() for name, make in layouts.items()}

    def head_call(index: SpanIndex) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            with torch.inference_mode(), sdpa_kernel(_BACKENDS):
                probs: torch.Tensor = head(hidden, table, index)
            return probs

        return call

    probs = {name: head_call(index)() for name, index in indexes.items()}
    diff = float((probs["packed"].float() - probs["apart"].float()).abs().max())
    times: dict[str, list[float]] = {name: [] for name in layouts}
    copies: dict[str, list[float]] = {name: [] for name in layouts}
    for name in layouts:  # warm-up
        ms_per_call(head_call(indexes[name]), calls=10, rounds=1)
    for _ in range(args.rounds):
        for name, make in layouts.items():
            times[name].append(ms_per_call(head_call(indexes[name]), rounds=1))
            copies[name].append(statistics.median(synced_ms(make) for _ in range(10)))
    for name in layouts:
        emit(
            rows,
            kind="layout",
            layout=name,
            head_ms_p50=round(statistics.median(times[name]), 3),
            head_ms_min=round(min(times[name]), 3),
            to_device_ms_p50=round(statistics.median(copies[name]), 3),
            rounds=args.rounds,
        )
    emit(rows, kind="bits", max_abs_diff=diff)
    (out / "staging_probe.jsonl").write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
