"""`python3 -m bench.batcher_gpu`: the service's batcher driving the full-size engine on one GPU.

`bench.engine` streams with its own loop; this runs the service's `consumer.batching.batcher.Batcher` instead,
as
`Pipeline` uses it (records submitted in runs of `prepare_chunk`, prepared in the prepare pool, batches
flushed by `max_batch_records` / `max_batch_tokens` / `max_wait_ms`, staged and answered in the prepare
pool, only `Engine.run` on the GPU thread), with no Kafka around it. For each batcher setting it also runs
`bench.engine.stream` at the same token budget in the same call, so the two rates compare directly.
Prints JSON lines; writes them to `batcher_gpu.jsonl` under `--out` (default `$OUT` or `bench-out/`).
Not a test: nothing here asserts a speed. Needs CUDA.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.engine import TimedRun, stream
from bench.load_run import Metered
from bench.workload import build_engine, make_request
from consumer.batching.batcher import Batcher
from consumer.settings import BatchingSettings
from engine.batching.cut import BatchLimits
from engine.model.graphs import default_buckets
from engine.runner import Engine, EngineConfig
from schemas.systemone import SystemOneRequest, SystemOneResponse

SETTINGS = ((32, 32_768), (256, 32_768), (256, 65_536), (256, 131_072))  # (max records, max tokens)


async def through_batcher(
    engine: Engine, requests: Sequence[SystemOneRequest], max_records: int, max_tokens: int
) -> dict[str, float]:
    """Submit every request in runs of `prepare_chunk` (as the pipeline does) and wait for all answers;
    the figures are `bench.engine.TimedRun.figures` (from the first submission to the last answer)."""
    settings = BatchingSettings(max_batch_records=max_records, max_batch_tokens=max_tokens)
    timed_run = TimedRun(engine)
    batcher: Batcher[Any, Any, Any] = Batcher(Metered(engine, settings.limits, timed_run), settings)
    await batcher.start()
    t0 = time.perf_counter()
    step = settings.prepare_chunk
    futures = [batcher.submit(engine.prepare, requests[i : i + step]) for i in range(0, len(requests), step)]
    outcomes = [o for fut in futures for o in await fut]
    end = time.perf_counter()
    await batcher.close(5.0)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    if failed:
        raise RuntimeError(f"{len(failed)} records failed, first: {failed[0]!r}")
    tokens = sum(o.usage.input_tokens for o in outcomes if isinstance(o, SystemOneResponse))
    return timed_run.figures(tokens, t0, end)


def main(out_dir: str | None = None, count: int = 1024) -> int:
    """Build the engine, then measure each setting through the batcher and through `stream`; returns 0."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench batcher_gpu needs a CUDA GPU (run it on the H200)")
    from consumer.logging import configure_logging

    configure_logging("warning")  # the batcher logs a line per batch at info
    out = Path(out_dir or os.environ.get("OUT") or "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    sink = (out / "batcher_gpu.jsonl").open("w")

    def emit(**fields: Any) -> None:
        line = json.dumps(fields)
        print(line, flush=True)
        sink.write(line + "\n")

    top = max(tokens for _, tokens in SETTINGS)
    config = EngineConfig(device="cuda", dtype="bfloat16", limits=BatchLimits(top, 256))
    t0 = time.perf_counter()
    engine = build_engine(config)
    engine.model.enable_fast_path(graph_buckets=default_buckets(top))
    emit(kind="info", gpu=torch.cuda.get_device_name(), build_s=round(time.perf_counter() - t0, 1))
    rng = random.Random(0)
    requests = [make_request(rng, engine, 512) for _ in range(count)]
    stream(engine, requests[:64], 32_768, 256)  # warm-up: first launches of every kernel
    asyncio.run(through_batcher(engine, requests[:128], 256, 32_768))
    for max_records, max_tokens in SETTINGS:
        for how in ("batcher", "stream"):
            if how == "batcher":
                r = asyncio.run(through_batcher(engine, requests, max_records, max_tokens))
            else:
                r = stream(engine, requests, max_tokens, max_records)
            emit(
                kind="throughput",
                how=how,
                max_batch_records=max_records,
                max_batch_tokens=max_tokens,
                requests=count,
                tok_s=round(r["tok_s"]),
                steady_tok_s=round(r["steady_tok_s"]),
                gpu_thread_busy=round(r["gpu_thread_busy"], 3),
                batches=int(r["batches"]),
                batch_ms_p50=round(r["batch_ms_p50"], 1),
                records_per_batch=round(r["records_per_batch"], 1),
            )
    sink.close()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--requests", type=int, default=1024)
    args = parser.parse_args()
    raise SystemExit(main(args.out, args.requests))
