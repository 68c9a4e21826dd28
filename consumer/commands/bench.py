"""`clef-router bench engine` (the engine benchmark on the full-size model, needs the H200) and
`clef-router bench load` (latency under load through the service's batcher; `--cpu` for a smoke run)."""

from __future__ import annotations

import argparse

from consumer.commands import Commands


def register(commands: Commands) -> None:
    """Add `bench engine`."""
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
