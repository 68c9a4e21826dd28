"""`clef-router run`, `produce`, `dlq replay` and `bench pipeline` (`tail`: `consumer.commands.tail`).

`run` loads settings (env `CLEF_*`, optional `--config` TOML), prints them masked, loads the engine (a
release directory, or `--stub-engine` for demos and benchmarks), then serves Kafka and HTTP until SIGTERM
or SIGINT: stop fetching, drain, commit, exit 0. A fatal error (DLQ guard, exhausted retries) exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

from consumer.commands import CommandError, Commands, UsageError
from consumer.commands.client import DEFAULT_TIMEOUT_S, error_text, run_client, started

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "events.jsonl"


def register(commands: Commands) -> None:
    """Add `run`, `produce`, `dlq replay` and `bench pipeline`."""
    p = commands.add_parser(
        "run",
        help="Run the Kafka routing service and its HTTP server (settings: CLEF_* variables, listed below)",
        formatter_class=_SettingsHelpFormatter,
    )
    p.add_argument("--config", type=Path, default=None, help="TOML settings file (env CLEF_* overrides it)")
    p.add_argument(
        "--stub-engine", action="store_true", help="answer instantly without a model (demo, bench)"
    )
    p.set_defaults(func=_run)

    p = commands.add_parser("produce", help="Send the sample alert/fault events to the input topic")
    _add_kafka_options(p)
    p.add_argument("--topic", default=None, help="topic to send to (default: the first input topic)")
    p.add_argument("--file", type=Path, default=SAMPLES, help="JSON lines of {key, headers, value}")
    p.add_argument("--repeat", type=int, default=1, help="send the whole file this many times")
    p.set_defaults(func=_produce)

    dlq = commands.group("dlq", "Dead-letter topic tools")
    p = dlq.add_parser(
        "replay",
        help="Send DLQ records back to their original topic",
        description="Send DLQ records back to their original topic (original value, key and headers).",
    )
    _add_kafka_options(p)
    p.add_argument(
        "--reason",
        action="append",
        default=[],
        choices=_reason_codes(),
        metavar="CODE",
        help=f"only records with this reason code (repeatable): {', '.join(_reason_codes())}",
    )
    p.add_argument("--limit", type=int, default=None, help="replay at most this many records")
    p.add_argument("--group", default=None, help="replay consumer group (default: <group_id>.dlq-replay)")
    p.add_argument(
        "--dry-run", action="store_true", help="count what would be replayed; send and commit nothing"
    )
    p.set_defaults(func=_dlq_replay)

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


def _add_kafka_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None, help="TOML settings file (env CLEF_* overrides it)")
    p.add_argument(
        "--bootstrap", default=None, help="Kafka bootstrap servers (default: CLEF_KAFKA__BOOTSTRAP_SERVERS)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"give up after this many seconds, e.g. when the broker is down (default {DEFAULT_TIMEOUT_S:g})",
    )


def _reason_codes() -> list[str]:
    from schemas.errors import DlqReason

    return [r.value for r in DlqReason]


class _SettingsHelpFormatter(argparse.HelpFormatter):
    """`run --help`: the usual help, then every `CLEF_*` setting with its default (built only for --help)."""

    def format_help(self) -> str:
        return super().format_help() + "\n" + settings_help()


def settings_help() -> str:
    """Every setting as its environment variable and default, one per line (from `consumer.settings`)."""
    from pydantic import BaseModel

    from consumer.settings import ENV_PREFIX, Settings

    lines = ["settings (environment variables; a TOML file given with --config uses the same names):"]
    for name, field in Settings.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            for sub, sub_field in ann.model_fields.items():
                default = sub_field.get_default(call_default_factory=True)
                shown = json.dumps(default, default=str) if not isinstance(default, BaseModel) else "(object)"
                shown = shown if len(shown) <= 70 else shown[:67] + "..."
                lines.append(f"  {ENV_PREFIX}{name.upper()}__{sub.upper()}  default {shown}")
        else:
            lines.append(f"  {ENV_PREFIX}{name.upper()}  default {json.dumps(field.default, default=str)}")
    return "\n".join(lines) + "\n"


def load_cli_settings(args: argparse.Namespace, **overrides: Any) -> Any:
    """Settings for a command: `--config`, `--bootstrap` when the command has them, and the environment.
    Raises `UsageError` (exit 2) for an unknown or invalid setting."""
    from consumer.settings import SettingsError, load_settings

    if getattr(args, "bootstrap", None):
        overrides.setdefault("kafka", {})["bootstrap_servers"] = args.bootstrap
    try:
        return load_settings(getattr(args, "config", None), **overrides)
    except SettingsError as exc:
        raise UsageError(str(exc)) from exc


_settings = load_cli_settings


def _run(args: argparse.Namespace) -> int:
    from consumer.logging import configure_logging, get_logger

    settings = _settings(args)
    if not args.stub_engine:
        _check_engine_settings(settings.engine)  # a permanent error is the only line printed
    configure_logging(settings.log_level)
    log = get_logger("consumer.service")
    log.info("settings", settings=settings.masked())
    engine = _load_engine(settings, stub=args.stub_engine)
    log.info("engine_loaded", stub=args.stub_engine, device=settings.engine.device)
    try:
        asyncio.run(_serve(settings, engine))
    except Exception as exc:
        log.error("service_failed", error=repr(exc)[:300])
        raise CommandError(f"service stopped: {error_text(exc)}") from exc
    return 0


def _check_engine_settings(e: Any) -> None:
    """Raise `UsageError` (exit 2: a permanent error, restarting cannot help) for a missing release
    directory and for `cuda` on a machine without CUDA."""
    if e.model_path is None:
        raise UsageError("set CLEF_ENGINE__MODEL_PATH (a release directory) or pass --stub-engine")
    if not e.model_path.is_dir():
        raise UsageError(
            f"CLEF_ENGINE__MODEL_PATH={e.model_path} is not a directory "
            "(a Clef-omni release, or one written by 'clef-router make-tiny-release DIR')"
        )
    import torch

    if str(e.device).startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(
            f"CLEF_ENGINE__DEVICE={e.device} but this machine has no usable CUDA GPU; "
            "set CLEF_ENGINE__DEVICE=cpu (and CLEF_ENGINE__DTYPE=float32) to run on the CPU"
        )


def _load_engine(settings: Any, *, stub: bool) -> Any:
    """The engine for `run` (blocking: loads the weights). Raises `UsageError` for a release that cannot
    be read (see `_check_engine_settings` for the checks made before)."""
    if stub:
        from bench.stub import StubEngine

        return StubEngine()
    e = settings.engine
    from engine.release import ReleaseError
    from engine.runner import Engine, EngineConfig

    config = EngineConfig(
        device=e.device,
        dtype=e.dtype,
        max_batch_tokens=settings.batching.max_batch_tokens,
        max_batch_records=settings.batching.max_batch_records,
        max_tokens=e.max_input_tokens,
        truncate_state=e.truncate_state,
        confidence_formula=e.confidence_formula,
    )
    try:
        return Engine.from_release(e.model_path, config=config)
    except (ReleaseError, FileNotFoundError) as exc:
        raise UsageError(f"cannot load the release in {e.model_path}: {error_text(exc)}") from exc


async def _serve(settings: Any, engine: Any) -> None:
    from consumer.http import HttpServer
    from consumer.pipeline import Pipeline

    pipeline = Pipeline(settings, engine)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, pipeline.request_stop)
    server = None
    if settings.http.enabled:
        server = HttpServer(settings.http, pipeline, pipeline.metrics, [settings.engine.model_name])
        await server.start()
    try:
        await pipeline.run()
    finally:
        if server is not None:
            await server.stop()


def _produce(args: argparse.Namespace) -> int:
    settings = _settings(args)
    topic = args.topic or settings.topics.input[0]
    if args.repeat < 1 or args.timeout <= 0:
        raise UsageError("--repeat must be >= 1 and --timeout positive")
    try:
        lines = [json.loads(line) for line in args.file.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read samples from {args.file}: {exc}") from exc
    bootstrap = settings.kafka.bootstrap_servers
    items = lines * args.repeat
    sent = run_client(
        lambda: _send_samples(settings, topic, items), bootstrap=bootstrap, timeout_s=args.timeout
    )
    print(f"sent {sent} events to {topic} at {bootstrap}")
    return 0


async def _send_samples(settings: Any, topic: str, items: list[dict[str, Any]]) -> int:
    from consumer.producer import Producer
    from consumer.router import OutRecord
    from consumer.source import ensure_topics

    await ensure_topics(settings.kafka, [topic])
    producer = Producer(settings.kafka)
    async with started(producer, producer.stop, bootstrap=settings.kafka.bootstrap_servers):
        futures = []
        for item in items:
            key = str(item["key"]).encode() if item.get("key") is not None else None
            headers = tuple((str(k), str(v).encode()) for k, v in (item.get("headers") or {}).items())
            value = json.dumps(item["value"]).encode()
            futures.append(await producer.send(OutRecord(topic, key, value, headers)))
        await asyncio.gather(*futures)
        return len(futures)


def _dlq_replay(args: argparse.Namespace) -> int:
    from consumer.dlq import reason_filter, replay

    settings = _settings(args)
    if args.timeout <= 0 or (args.limit is not None and args.limit < 1):
        raise UsageError("--timeout must be positive and --limit >= 1")
    reasons = reason_filter(args.reason)  # argparse already checked the codes
    group = args.group or f"{settings.kafka.group_id}.dlq-replay"
    counts = run_client(
        lambda: replay(
            settings.kafka,
            settings.topics.dlq,
            group_id=group,
            reasons=reasons,
            limit=args.limit,
            dry_run=args.dry_run,
        ),
        bootstrap=settings.kafka.bootstrap_servers,
        timeout_s=args.timeout,
    )
    if args.dry_run:  # nothing was sent: say what would have been
        counts = {"would_replay": counts.pop("replayed"), **counts}
    print(json.dumps({"dlq_topic": settings.topics.dlq, "dry_run": args.dry_run, **counts}))
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
