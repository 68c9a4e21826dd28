"""`clef-router bench engine`: the engine benchmark on the full-size model (needs the H200)."""

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


def _bench_engine(args: argparse.Namespace) -> int:
    from bench.engine import main

    return main(out_dir=args.out, quick=args.quick)
