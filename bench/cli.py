"""`python -m bench COMMAND ...`: the benchmarks' command line, run from a checkout.

Commands: `engine` (the engine on the full-size model, needs CUDA), `pipeline` (service events/s on the stub
engine against a plain aiokafka loop), `http` (the HTTP API on the stub engine), `load` (latency under load
through the service's batcher; `--cpu` for a smoke run) and `startup` (start-up from a full-size release).
Each handler imports its bench only when it runs, so `--help` stays fast. `clef-router bench ...` is an alias
(`consumer.commands.bench`) that hands its arguments to `run` with its own program name.
Other benches run as their own modules (`python -m bench.e2e`, `python -m bench.soak`, ...).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bench.load import add_arguments as add_load_arguments
from consumer.commands import CommandError, UsageError

PROG = "python -m bench"
_LOAD_DESCRIPTION = (
    "Single-request latency, capacity per token budget, then open-loop Poisson arrivals at shares of "
    "capacity, fixed limits and adaptive side by side (`python3 -m bench.load`). --cpu runs the tiny "
    "release on CPU."
)


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The parser of every command, its usage lines starting with `prog`."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Benchmarks of clef-router (run from a checkout)."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands", required=True)
    p = commands.add_parser(
        "engine",
        help="Whole engine path, full-size Clef-omni thinker (random bf16 weights) vs plain transformers",
        description="Builds the full-size thinker + joint head on the GPU and measures throughput, latency, "
        "head share and memory against the plain transformers backbone. Needs CUDA.",
    )
    p.add_argument("--out", default=None, help="output folder (default: $OUT or bench-out/)")
    p.add_argument("--quick", action="store_true", help="fewer requests per workload")
    p.set_defaults(func=_engine)

    help_text = "Service events/s (stub engine) vs a plain aiokafka loop"
    p = commands.add_parser("pipeline", help=help_text, description=help_text)
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
    _add_sets(p, "a setting for the service run, e.g. batching.max_batch_records=32")
    p.set_defaults(func=_pipeline)

    p = commands.add_parser(
        "http",
        help="HTTP API requests/s, p50/p99 latency and the server's own overhead (stub engine)",
        description="Starts `clef-router serve --stub-engine` on 127.0.0.1 and loads it with keep-alive "
        "connections; overhead = round trip minus the time the request spent in the batcher.",
    )
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated connection counts")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per concurrency")
    p.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per concurrency")
    _add_sets(p, "a setting for the server, e.g. batching.max_wait_ms=0")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.set_defaults(func=_http)

    p = commands.add_parser(
        "load",
        help="Latency vs load through the service's batcher, fixed and adaptive batching (full size on CUDA)",
        description=_LOAD_DESCRIPTION,
    )
    add_load_arguments(p)
    p.set_defaults(func=_load)

    # `startup` has subcommands of its own, parsed by `bench.startup.main` (its --help lists them)
    p = commands.add_parser(
        "startup",
        help="Start-up from a full-size release: write it, load it, serve to /readyz, kill -9 and restart",
        description="`python3 -m bench.startup` (its --help lists the steps). Needs CUDA for full size.",
        add_help=False,
        prefix_chars="\0",
    )
    p.add_argument("startup_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=partial(_startup, prog=f"{prog} startup"))
    return parser


def run(argv: Sequence[str], prog: str = PROG) -> int:
    """Parse `argv` and run the command (blocking, for as long as the bench runs); returns its exit code.

    Raises `UsageError` for option values argparse cannot check, whatever the bench raises, and argparse's
    `SystemExit` for `--help` and usage errors. Leaves logging as the caller configured it, except that
    `pipeline` and `load` set it to warnings (a line per batch at info would drown the figures).
    """
    args = build_parser(prog).parse_args(list(argv))
    return int(args.func(args))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench`: `run` on `argv` (default: the command line) with logging on stderr; a `UsageError`
    or `CommandError` becomes one line on stderr and its exit code."""
    from consumer.logging import configure_logging

    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    configure_logging("info", json=False)  # stdout is for the figures
    try:
        return int(args.func(args))
    except CommandError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code


def _add_sets(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help=f"{what} (repeatable; JSON values)",
    )


def _engine(args: argparse.Namespace) -> int:
    from bench.engine import main as engine_main

    return engine_main(out_dir=args.out, quick=args.quick)


def _load(args: argparse.Namespace) -> int:
    from bench.load import run as load_run
    from consumer.logging import configure_logging

    configure_logging("warning")
    return load_run(args)


def _startup(args: argparse.Namespace, *, prog: str) -> int:
    from bench.startup import main as startup_main

    return startup_main(args.startup_args, prog=prog)


def _http(args: argparse.Namespace) -> int:
    from bench.http import main as http_main

    try:
        levels = tuple(int(c) for c in args.concurrency.split(",") if c.strip())
    except ValueError:
        levels = ()
    if not levels or min(levels) < 1 or args.seconds <= 0:
        raise UsageError("--concurrency takes positive integers (e.g. 1,16,64) and --seconds must be > 0")
    results = http_main(
        concurrency=levels, seconds=args.seconds, warmup_s=args.warmup, settings=parse_sets(args.set)
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _pipeline(args: argparse.Namespace) -> int:
    from bench.pipeline import KINDS
    from bench.pipeline import main as pipeline_main
    from consumer.logging import configure_logging

    if args.events < 100 or args.repeats < 1:
        raise UsageError("--events must be >= 100 and --repeats >= 1")
    overrides = parse_sets(args.set)
    configure_logging("warning")
    result = pipeline_main(
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


def parse_sets(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`SECTION.KEY=VALUE` items as settings overrides (VALUE as JSON, else a string), checked against the
    settings model. Raises `UsageError` for a malformed item or a value the settings reject."""
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
