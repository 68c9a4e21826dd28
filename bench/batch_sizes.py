"""`python3 -m bench.batch_sizes`: one batch's `Engine.run` time by size, eager against CUDA graphs.

The service's batches at moderate load hold a handful of records (about 4,000 tokens at 70% of capacity:
BENCHMARKS.md, "Priority classes"), just above what was the largest graph bucket (4,096), so they ran the
decoder eagerly: ~40 launches per layer from Python, while the prepare thread and the event loop want the
GIL too. This bench measures what that costs, on the full-size engine (random bf16 weights, levelled
routers, the FP8 mode of `--fp8`):

1. batches of the load mix (`bench.load.make_pool`) cut to about each of `--sizes` tokens (a few distinct
   batches per size, rotated, so no two timed runs in a row read one set of inputs);
2. per size, `Engine.run` of a staged batch (decoder, head, copy back; what the GPU thread does per batch),
   synchronised, `--reps` times after warm-up (`bench.engine.timings`): p50 and min ms, with no other
   thread, and with `--hog` threads calling `Engine.prepare` in a loop meanwhile (the prepare pool's GIL
   pressure);
3. all of that twice: graphs up to 4,096 tokens (the default before this bench) and graphs up to
   `--graph-to` tokens (`buckets_to`), plus the capture time and the device memory of each set (the first
   set's time includes the experts' FP8 quantisation, which happens once).

Prints JSON lines and a table; writes `batch_sizes.jsonl` to `--out`. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.engine import timings
from bench.report import emit_line as emit
from engine.model.graphs import GRAPH_BUCKETS

MID_BUCKETS = (5120, 6144, 7168, 8192, 10240, 12288, 14336, 16384, 24576, 32768)
"""Token buckets above 4,096 tried here (the product's `GRAPH_BUCKETS` go to 8,192 since this bench); the
last two only for full batches at capacity (a batch between them pads up to a third of its bucket)."""


def buckets_to(largest: int) -> tuple[int, ...]:
    """Graph buckets up to `largest` tokens: the product's `GRAPH_BUCKETS` and `MID_BUCKETS` together."""
    return tuple(b for b in sorted({*GRAPH_BUCKETS, *MID_BUCKETS}) if b <= largest)


def cut_batches(prepared: Sequence[Any], size: int, count: int, rng: random.Random) -> list[list[Any]]:
    """`count` batches of records from `prepared`, each filled in a shuffled order up to `size` tokens."""
    batches: list[list[Any]] = []
    for _ in range(count):
        order = list(prepared)
        rng.shuffle(order)
        batch: list[Any] = []
        tokens = 0
        for p in order:
            if tokens + p.num_tokens <= size:
                batch.append(p)
                tokens += p.num_tokens
            if tokens > 0.95 * size:
                break
        batches.append(batch)
    return batches


def _rotating(engine: Any, staged: list[Any]) -> Callable[[], None]:
    """A call that runs the next of `staged` (in turn) through `engine.run`."""
    turn = itertools.cycle(staged)
    return lambda: engine.run(next(turn))


class Hog:
    """`threads` threads calling `engine.prepare` over `requests` until stopped (the prepare pool's load)."""

    def __init__(self, engine: Any, requests: Sequence[Any], threads: int) -> None:
        self._engine = engine
        self._requests = requests
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]
        self._lock = threading.Lock()
        self.prepared = 0  # requests prepared by all threads (each adds its count once, when stopped)

    def _loop(self) -> None:
        done = 0
        while not self._stop.is_set():
            self._engine.prepare(self._requests[done % len(self._requests)])
            done += 1
        with self._lock:
            self.prepared += done

    def __enter__(self) -> Hog:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--fp8", choices=("off", "experts", "attention", "text"), default="attention")
    p.add_argument("--sizes", default="896,2048,4096,5120,6144,8192,12288,16384")
    p.add_argument("--graph-to", type=int, default=16384, help="largest graph bucket of the second set")
    p.add_argument(
        "--max-graph-records", type=int, default=16, help="small buckets' slots (larger: RECORD_TOKENS)"
    )
    p.add_argument("--reps", type=int, default=12)
    p.add_argument(
        "--hog", type=int, default=1, help="threads calling Engine.prepare during the second timing"
    )
    p.add_argument(
        "--layers", type=int, default=None, help="decoder layers (default 48; fewer: a quick probe)"
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []

    from bench.e2e_run import FP8_MODES
    from bench.load import make_pool
    from bench.workload import build_engine
    from engine.batching.cut import BatchLimits
    from engine.runner import EngineConfig

    config = EngineConfig(device="cuda", dtype="bfloat16", limits=BatchLimits(32768, 256), graph_buckets=())
    engine = build_engine(config, num_layers=args.layers, routing="levelled")
    rng = random.Random(0)
    pool = make_pool(engine, rng, 512)
    prepared = [engine.prepare(r) for r in pool]
    sizes = [int(s) for s in args.sizes.split(",")]
    batches = {size: cut_batches(prepared, size, 4, rng) for size in sizes}
    emit(
        rows,
        kind="info",
        gpu=torch.cuda.get_device_name(),
        fp8=args.fp8,
        layers=args.layers or 48,
        torch=torch.__version__,
    )
    sets = {"default": buckets_to(4096), "mid": buckets_to(args.graph_to)}
    table: dict[tuple[str, int], dict[str, Any]] = {}
    for name, buckets in sets.items():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.model.enable_fast_path(
            graph_buckets=buckets, max_graph_records=args.max_graph_records, **FP8_MODES[args.fp8]
        )
        torch.cuda.synchronize()
        emit(
            rows,
            kind="graphs",
            set=name,
            largest=max(buckets),
            capture_s=round(time.perf_counter() - t0, 2),
            allocated_gb=round(torch.cuda.memory_allocated() / 1e9, 2),
            reserved_gb=round(torch.cuda.memory_reserved() / 1e9, 2),
        )
        for size in sizes:
            run_one = _rotating(engine, [engine.stage(b) for b in batches[size]])

            alone = timings(run_one, args.reps)
            with Hog(engine, pool[:64], args.hog) as hog:
                contended = timings(run_one, args.reps)
            records = statistics.mean(len(b) for b in batches[size])
            tokens = statistics.mean(sum(p.num_tokens for p in b) for b in batches[size])
            row = {
                "set": name,
                "size": size,
                "records": round(records, 1),
                "tokens": round(tokens),
                "ms_p50": round(alone["ms_p50"], 2),
                "ms_min": round(alone["ms_min"], 2),
                "hog_ms_p50": round(contended["ms_p50"], 2),
                "hog_prepared": hog.prepared,
            }
            emit(rows, kind="size", **row)
            table[(name, size)] = row
        emit(rows, kind="memory", set=name, peak_gb=round(torch.cuda.max_memory_allocated() / 1e9, 2))
    (out / "batch_sizes.jsonl").write_text("\n".join(rows) + "\n")
    print(f"| size | records | tokens | graphs to 4096: ms p50 | +hog | to {args.graph_to}: ms p50 | +hog |")
    print("|---|---|---|---|---|---|---|")
    for size in sizes:
        d, m = table[("default", size)], table[("mid", size)]
        print(
            f"| {size} | {d['records']} | {d['tokens']} | {d['ms_p50']} | {d['hog_ms_p50']} "
            f"| {m['ms_p50']} | {m['hog_ms_p50']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
