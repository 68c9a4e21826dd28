"""`python3 -m bench.load` / `python -m bench load`: latency under load through the service's batcher.

Drives `consumer.batching.batcher.Batcher` (as `Pipeline` uses it, no Kafka) with the engine: on CUDA the
full-size
Clef-omni thinker with random bf16 weights (`bench.workload.build_engine`, fast path and CUDA graphs), on CPU
(`--cpu`, or no GPU) the tiny release, for a smoke run. In one run:

1. single-request latency: one event at a time, `Engine.execute` directly and through the adaptive batcher;
2. capacity: a backlog of events through the batcher at each fixed token budget and adaptive, events/s
   from the first batch on the GPU to the last answer; the best fixed budget's rate is the reference;
3. open-loop Poisson arrivals at each load (a share of the reference capacity), one event per submission
   (as HTTP requests arrive), for each batching mode side by side; per load: events/s in and out,
   latency arrival -> answer (p50/p95/p99), records and tokens per batch, GPU busy share (the GPU thread's
   time in `Engine.run`, and the service's `clef_router_gpu_busy_seconds` metric), backlog at the end.

Event mix (`--mix`): target lengths drawn 40% from 200-500 tokens, 40% from 500-1,000 and 20% from
1,000-1,500 (uniform within); 3 questions each (`bench.workload.make_request`). The prompt and schema of the
tiny release's tokenizer take about 400 tokens, so the shortest events come out near 450; the JSON states the
lengths actually produced. Prints JSON lines and writes `load.jsonl` and `load.log` to `--out` (default
`$OUT` or `bench-out/`); `python3 -m bench.load_plot` draws the PNG from the JSON. Not a test: nothing here
asserts a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.routing import ROUTINGS

if TYPE_CHECKING:
    from bench.load_run import LoadRunner
    from bench.routing import Routing

MIX = ((0.4, 200, 500), (0.4, 500, 1000), (0.2, 1000, 1500))  # (share, min tokens, max tokens)
LOADS = (0.10, 0.25, 0.50, 0.70, 0.90, 1.10)


def build(cpu: bool, max_tokens: int, routing: Routing = "levelled") -> Any:
    """The engine: full-size on CUDA (blocking, ~20 s; `routing` as `bench.routing` sets it up), or the
    tiny release on CPU (a few seconds; written to a temporary folder that is removed once it is loaded)."""
    from engine.batching.cut import BatchLimits
    from engine.runner import Engine, EngineConfig

    if cpu:
        import tempfile

        from devtools.tiny_release import write_tiny_release

        config = EngineConfig(device="cpu", dtype="float32", limits=BatchLimits(max_tokens, 256))
        with tempfile.TemporaryDirectory(prefix="clef-load-") as folder:
            return Engine.from_release(write_tiny_release(Path(folder) / "tiny"), config=config)
    from bench.workload import build_engine
    from engine.model.graphs import default_buckets

    config = EngineConfig(device="cuda", dtype="bfloat16", limits=BatchLimits(max_tokens, 256))
    engine = build_engine(config, routing=routing)
    engine.model.enable_fast_path(graph_buckets=default_buckets(max_tokens))
    return engine


def make_pool(engine: Any, rng: random.Random, size: int) -> list[Any]:
    """`size` distinct requests whose target lengths follow `MIX`."""
    from bench.workload import make_request

    shares = [share for share, _, _ in MIX]
    pool = []
    for _ in range(size):
        _, low, high = rng.choices(MIX, weights=shares)[0]
        pool.append(make_request(rng, engine, rng.randint(low, high)))
    return pool


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `bench.load` (also those of `python -m bench load`)."""
    p.add_argument("--out", default=None, help="output folder (default: $OUT or bench-out/)")
    p.add_argument("--cpu", action="store_true", help="tiny release on CPU (a smoke run)")
    p.add_argument(
        "--routing",
        choices=ROUTINGS,
        default="levelled",
        help="full: levelled (default) or random routers",
    )
    p.add_argument("--seconds", type=float, default=12.0, help="arrival window per load")
    p.add_argument("--loads", default=",".join(str(x) for x in LOADS), help="shares of capacity")
    p.add_argument("--budgets", default="32768,65536,131072", help="fixed token budgets for capacity")
    p.add_argument("--adaptive-max", type=int, default=131_072, help="adaptive mode's max_batch_tokens")
    p.add_argument("--latency-target-ms", type=float, default=250.0, help="adaptive mode's latency target")
    p.add_argument("--backlog", type=int, default=1024, help="events per capacity run")
    p.add_argument("--pool", type=int, default=256, help="distinct requests")
    p.add_argument("--singles", type=int, default=40, help="single-request repetitions")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the command line) and run the whole measurement; returns 0."""
    p = argparse.ArgumentParser(prog="bench.load", description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(p)
    return run(p.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """The whole measurement (see the module docstring) with parsed options; returns 0."""
    import torch

    from bench.load_run import FIXED_DEFAULT, LoadRunner, capacity, single_latency

    cpu = args.cpu or not torch.cuda.is_available()
    out = Path(args.out or os.environ.get("OUT") or "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    sink = (out / "load.jsonl").open("w")
    logf = (out / "load.log").open("w")
    t_start = time.perf_counter()

    def emit(**fields: Any) -> None:
        line = json.dumps(fields)
        print(line, flush=True)
        sink.write(line + "\n")
        sink.flush()

    def note(message: str) -> None:
        logf.write(f"{time.perf_counter() - t_start:8.1f}s {message}\n")
        logf.flush()

    budgets = [int(b) for b in args.budgets.split(",")]
    top = max([*budgets, args.adaptive_max])
    t0 = time.perf_counter()
    engine = build(cpu, top, args.routing)
    rng = random.Random(0)
    pool = make_pool(engine, rng, args.pool)
    lengths = sorted(engine.prepare(r).num_tokens for r in pool)
    emit(
        kind="info",
        device="cpu (tiny release)" if cpu else torch.cuda.get_device_name(),
        torch=torch.__version__,
        transformers=_version("transformers"),
        build_s=round(time.perf_counter() - t0, 1),
        mix=[list(m) for m in MIX],
        tokens_min=lengths[0],
        tokens_p50=lengths[len(lengths) // 2],
        tokens_mean=round(statistics.mean(lengths), 1),
        tokens_max=lengths[-1],
        seconds_per_load=args.seconds,
        latency_target_ms=args.latency_target_ms,
    )
    note("engine built, pool made")
    asyncio.run(capacity(engine, pool[:64], FIXED_DEFAULT))  # warm-up: first launches and graph captures

    singles = single_latency(engine, pool, args.singles)
    emit(kind="single", **singles)
    note("single-request latency measured")

    adaptive = {
        "mode": "adaptive",
        "max_batch_tokens": args.adaptive_max,
        "latency_target_ms": args.latency_target_ms,
    }
    fixed_runs = {}
    backlog = [pool[i % len(pool)] for i in range(args.backlog)]
    for budget in budgets:
        fixed = {**FIXED_DEFAULT, "max_batch_tokens": budget}
        r = asyncio.run(capacity(engine, backlog, fixed))
        fixed_runs[budget] = r["events_s"]
        emit(kind="capacity", mode="fixed", max_batch_tokens=budget, **r)
        note(f"capacity fixed {budget}: {r['events_s']} events/s")
    r = asyncio.run(capacity(engine, backlog, adaptive))
    best = max(fixed_runs, key=lambda b: fixed_runs[b])
    reference = fixed_runs[best]
    emit(
        kind="capacity",
        mode="adaptive",
        max_batch_tokens=args.adaptive_max,
        share_of_best_fixed=round(r["events_s"] / reference, 3),
        best_fixed_budget=best,
        **r,
    )
    note(f"capacity adaptive: {r['events_s']} events/s; reference {reference} (fixed {best})")

    loads = [float(x) for x in args.loads.split(",")]
    modes: list[tuple[str, dict[str, Any]]] = [("fixed", dict(FIXED_DEFAULT)), ("adaptive", adaptive)]
    for name, settings in modes:
        runner = LoadRunner(engine, settings, pool, seed=1)
        asyncio.run(_sweep(runner, name, settings, loads, reference, args.seconds, emit, note))
    emit(kind="done", total_s=round(time.perf_counter() - t_start, 1))
    sink.close()
    try:
        from bench.load_plot import plot, read

        note(f"plot: {plot(read(out / 'load.jsonl'), out / 'load.png')}")
    except ImportError:
        note("matplotlib missing: no plot (run python3 -m bench.load_plot on the JSON)")
    logf.close()
    return 0


async def _sweep(
    runner: LoadRunner,
    name: str,
    settings: dict[str, Any],
    loads: Sequence[float],
    reference: float,
    seconds: float,
    emit: Callable[..., None],
    note: Callable[[str], None],
) -> None:
    """Every load in turn on one batcher (warmed up at half load first, as a service that runs)."""
    await runner.start()
    await runner.open_loop(reference * 0.5, min(3.0, seconds))
    for share in loads:
        r = await runner.open_loop(reference * share, seconds)
        emit(kind="load", mode=name, load=share, rate=round(reference * share, 2), settings=settings, **r)
        note(f"{name} {share:.0%}: p50 {r['p50_ms']} ms p99 {r['p99_ms']} ms out {r['events_out_s']}/s")
    await runner.close()


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    from consumer.logging import configure_logging

    # here, not in run(): a test calling main() must not leave structlog at warning for the whole session
    configure_logging("warning")  # the batcher logs a line per batch at info
    raise SystemExit(main())
