"""Profile one `Engine.execute` of 64 x 512-token requests on the full-size model (H200 only).

Alternates the whole execute with its parts to locate time that the parts do not account for.
Run: python -m bench.profile_execute
"""

from __future__ import annotations

import os
import random
import statistics
from functools import partial

import torch

from bench.timing import synced_ms
from bench.workload import build_engine, make_request
from engine.batching.cut import BatchLimits
from engine.runner import EngineConfig


def main() -> int:
    engine = build_engine(
        EngineConfig(device="cuda", dtype="bfloat16", limits=BatchLimits(65536, 256), graph_buckets=())
    )
    rng = random.Random(0)
    prepared = [engine.prepare(make_request(rng, engine, 512)) for _ in range(64)]
    model = engine.model
    for _ in range(3):
        engine.execute(prepared)
    whole, parts = [], []
    for _ in range(5):
        whole.append(synced_ms(lambda: engine.execute(prepared)))
        with torch.inference_mode():
            batch = model.collate([p.encoded for p in prepared])
            parts.append(synced_ms(partial(model.forward_batch, batch)))
    print(
        f"execute p50 {statistics.median(whole):.1f} ms; "
        f"forward_batch alone p50 {statistics.median(parts):.1f} ms",
        flush=True,
    )
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.execute(prepared)
        torch.cuda.synchronize()
    for key in ("cuda_time_total", "cpu_time_total"):
        table = prof.key_averages().table(sort_by=key, row_limit=22, max_name_column_width=60)
        print(table, flush=True)
        if os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], f"execute_{key}.txt"), "w") as fh:
                fh.write(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
