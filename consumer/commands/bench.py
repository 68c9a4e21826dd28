"""`clef-router bench engine` (the engine benchmark on the full-size model, needs the H200), `bench http`
(the HTTP API on the stub engine) and `bench load` (latency under load through the service's batcher;
`--cpu` for a smoke run)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from consumer.commands import Commands, UsageError


def register(commands: Commands) -> None:
    """Add `bench engine`, `bench http` and `bench load`."""
    h = commands.bench.add_parser(
        "http",
        help="HTTP API requests/s, p50/p99 latency and the server's own overhead (stub engine)",
        description="Starts `clef-router serve --stub-engine` on 127.0.0.1 and loads it with keep-alive "
        "connections; overhead = round trip minus the time the request spent in the batcher.",
    )
    h.add_argument("--concurrency", default="1,16,64", help="comma-separated connection counts")
    h.add_argument("--seconds", type=float, default=5.0, help="measured seconds per concurrency")
    h.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per concurrency")
    h.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a setting for the server, e.g. batching.max_wait_ms=0 (repeatable; JSON values)",
    )
    h.add_argument("--json", type=Path, default=None, help="also write the results here")
    h.set_defaults(func=_bench_http)
    p = commands.bench.add_parser(
        "engine",
        help="Whole engine path, full-size Clef-omni thinker (random bf16 weights) vs plain transformers",
        description="Builds the full-size thinker + joint head on the GPU and measures throughput, latency, "
        "head share and memory against the plain transformers backbone. Needs CUDA.",
    )
    p.add_argument("--out", default=None, help="output folder (default: $OUT or bench-out/)")
    p.add_argument("--quick", action="store_true", help="fewer requests per workload")
    p.set_defaults(func=_bench_engine)

    p = commands.bench.add_parser(
        "load",
        help="Latency vs load through the service's batcher, fixed and adaptive batching (full size on CUDA)",
        description="Single-request latency, capacity per token budget, then open-loop Poisson arrivals at "
        "shares of capacity, fixed limits and adaptive side by side (`python3 -m bench.load`). --cpu runs "
        "the tiny release on CPU.",
    )
    from bench.load import add_arguments

    add_arguments(p)
    p.set_defaults(func=_bench_load)


def _bench_engine(args: argparse.Namespace) -> int:
    from bench.engine import main

    return main(out_dir=args.out, quick=args.quick)


def _bench_load(args: argparse.Namespace) -> int:
    from bench.load import run

    return run(args)


def _bench_http(args: argparse.Namespace) -> int:
    from bench.http import main
    from consumer.commands.service import _parse_sets

    try:
        levels = tuple(int(c) for c in args.concurrency.split(",") if c.strip())
    except ValueError:
        levels = ()
    if not levels or min(levels) < 1 or args.seconds <= 0:
        raise UsageError("--concurrency takes positive integers (e.g. 1,16,64) and --seconds must be > 0")
    results = main(
        concurrency=levels, seconds=args.seconds, warmup_s=args.warmup, settings=_parse_sets(args.set)
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0
