"""`clef-router bench COMMAND ...`: an alias of `python -m bench COMMAND ...` for a checkout.

It registers one command that takes every argument after `bench` and hands them to `bench.cli.run` under
the program name `clef-router bench`. The `bench` package, which the product wheel does not ship, is
imported only when the command runs, never when the CLI is built.
"""

from __future__ import annotations

import argparse

from consumer.commands import Commands
from consumer.commands.checkout import require_dev_package

PROG = "clef-router bench"


def register(commands: Commands) -> None:
    """Add `bench` (its arguments are parsed by `bench.cli`)."""
    p = commands.add_parser(
        "bench",
        help="Benchmarks: engine, pipeline, http, load, startup (`python -m bench`; needs a checkout)",
        add_help=False,
        prefix_chars="\0",
    )
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    require_dev_package("bench", "clef-router bench")
    from bench.cli import run

    return run(args.bench_args, prog=PROG)
