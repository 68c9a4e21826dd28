"""The `clef-router bench` family: `bench engine` (the engine benchmark on the full-size model, needs the
H200), `bench pipeline` (service events/s on the stub engine vs a plain aiokafka loop), `bench http` (the
HTTP API on the stub engine) and `bench load` (latency under load through the service's batcher; `--cpu`
for a smoke run) and `bench startup` (start-up from a full-size release). The `bench` package is imported
only by these handlers, never by the service."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from consumer.commands import Commands, UsageError


def register(commands: Commands) -> None:
    """Add `bench pipeline`, `bench http`, `bench engine`, `bench load` and `bench startup`."""
    p = commands.bench.add_parser("pipeline", help="Service events/s (stub engine) vs a plain aiokafka loop")
    p.add_argument("--events", type=int, default=20_000, help="events per run (default 20000)")
    p.add_argument("--repeats", type=int, default=3, help="runs per kind; the median is reported (default 3)")
    p.add_argument("--bootstrap", default=None, help="use this broker instead of starting a local one")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument(
        "--only",
        action="append",
        choices=["plain", "service", "echo"],
        default=None,
        help="run only this kind (repeatable; default: all three)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a setting for the service run, e.g. batching.max_batch_records=32 (repeatable; JSON values)",
    )
    p.set_defaults(func=_bench_pipeline)
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

    # `bench load`'s own options are defined by `bench.load.add_arguments`; they are parsed in the handler,
    # so that building the CLI (every command, `run` included) never imports the `bench` package.
    p = commands.bench.add_parser(
        "load", help=_LOAD_HELP, description=_LOAD_DESCRIPTION, add_help=False, prefix_chars="\0"
    )
    p.add_argument("load_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=_bench_load)
    p = commands.bench.add_parser(
        "startup",
        help="Start-up from a full-size release: write it, load it, serve to /readyz, kill -9 and restart",
        description="`python3 -m bench.startup` (its --help lists the steps). Needs CUDA for full size.",
        add_help=False,
        prefix_chars="\0",
    )
    p.add_argument("startup_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=_bench_startup)


_LOAD_HELP = "Latency vs load through the service's batcher, fixed and adaptive batching (full size on CUDA)"
_LOAD_DESCRIPTION = (
    "Single-request latency, capacity per token budget, then open-loop Poisson arrivals at shares of "
    "capacity, fixed limits and adaptive side by side (`python3 -m bench.load`). --cpu runs the tiny "
    "release on CPU."
)


def _bench_engine(args: argparse.Namespace) -> int:
    from bench.engine import main

    return main(out_dir=args.out, quick=args.quick)


def _bench_load(args: argparse.Namespace) -> int:
    from bench.load import add_arguments, run
    from consumer.logging import configure_logging

    parser = argparse.ArgumentParser(prog="clef-router bench load", description=_LOAD_DESCRIPTION)
    add_arguments(parser)
    load_args = parser.parse_args(args.load_args)
    configure_logging("warning")  # the batcher logs a line per batch at info
    return run(load_args)


def _bench_startup(args: argparse.Namespace) -> int:
    from bench.startup import main

    return main(args.startup_args, prog="clef-router bench startup")


def _bench_http(args: argparse.Namespace) -> int:
    from bench.http import main

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


def _bench_pipeline(args: argparse.Namespace) -> int:
    from bench.pipeline import KINDS
    from bench.pipeline import main as bench_main
    from consumer.logging import configure_logging

    if args.events < 100 or args.repeats < 1:
        raise UsageError("--events must be >= 100 and --repeats >= 1")
    overrides = _parse_sets(args.set)
    configure_logging("warning")  # one JSON line per batch at info would drown the figures
    result = bench_main(
        events=args.events,
        repeats=args.repeats,
        bootstrap=args.bootstrap,
        kinds=tuple(dict.fromkeys(args.only)) if args.only else KINDS,
        service_settings=overrides,
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.flush()
    return 0


def _parse_sets(items: list[str]) -> dict[str, dict[str, Any]]:
    """`SECTION.KEY=VALUE` items as settings overrides (VALUE as JSON, else a string), checked against
    the settings model. Raises `UsageError`."""
    from consumer.settings import SettingsError, load_settings

    overrides: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        section, dot, key = name.partition(".")
        if not sep or not dot or not section or not key:
            raise UsageError(f"--set takes SECTION.KEY=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        overrides.setdefault(section, {})[key] = value
    try:
        load_settings(None, **overrides)
    except SettingsError as exc:
        raise UsageError(str(exc)) from exc
    return overrides
