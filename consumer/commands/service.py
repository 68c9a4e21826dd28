"""`clef-router run`, `serve` and `bench pipeline` (`produce`, `dlq replay`: `consumer.commands.records`).

`serve` is the HTTP API alone (no Kafka): same settings and engine; SIGTERM or SIGINT stops accepting,
lets requests in progress finish (up to `http.shutdown_timeout_s`), then exits 0.
`run` loads settings (env `CLEF_*`, optional `--config` TOML), prints them masked, loads the engine (a
release directory, or `--stub-engine` for demos and benchmarks), then serves Kafka and HTTP until SIGTERM
or SIGINT: stop fetching, drain, commit, exit 0. A fatal error (DLQ guard, exhausted retries) exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from pathlib import Path
from typing import Any

from consumer.commands import CommandError, Commands, UsageError
from consumer.commands.client import error_text, load_cli_settings


def register(commands: Commands) -> None:
    """Add `run`, `serve` and `bench pipeline`."""
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

    p = commands.add_parser("serve", help="Serve the SystemOne HTTP API alone (no Kafka)")
    p.add_argument("--config", type=Path, default=None, help="TOML settings file (env CLEF_* overrides it)")
    p.add_argument(
        "--stub-engine", action="store_true", help="answer instantly without a model (demo, bench)"
    )
    p.set_defaults(func=_serve_http)

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
    log.info(
        "engine_loaded",
        stub=args.stub_engine,
        device=settings.engine.device,
        device_index=settings.engine.device_index,
    )
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
    from consumer.settings import SettingsError, engine_device
    from engine.release import ReleaseError
    from engine.runner import Engine, EngineConfig

    try:
        device = engine_device(e)
    except SettingsError as exc:
        raise UsageError(str(exc)) from exc
    if e.device_index is not None and device.startswith("cuda"):
        import torch

        torch.cuda.set_device(e.device_index)  # kernels and CUDA graphs with no explicit device use it
    config = EngineConfig(
        device=device,
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
    """Kafka and HTTP on one loop. SIGTERM/SIGINT: the HTTP server stops accepting and lets requests in
    progress finish while the pipeline drains (HTTP requests already in the batcher are answered)."""
    from consumer.broker_watch import BrokerWatch
    from consumer.http import create_app
    from consumer.http_server import HttpServer
    from consumer.pipeline import Pipeline
    from consumer.serve import ServiceBackend

    pipeline = Pipeline(settings, engine)
    watch = BrokerWatch(settings.kafka, pipeline.metrics, settings.http.broker_unreachable_s)
    server = None
    if settings.http.enabled:
        app = create_app(
            settings.http, ServiceBackend(pipeline, watch), pipeline.metrics, settings.engine.model_name
        )
        server = HttpServer(settings.http, app)
        await server.start()

    def stop() -> None:
        pipeline.request_stop()
        if server is not None:
            server.request_stop()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    async def watch_once_started() -> None:
        # after the preflight: a bad password or certificate is then one line, not also the watch's retries
        await pipeline.started_event.wait()
        await watch.start()

    watcher = asyncio.create_task(watch_once_started(), name="clef-broker-watch-start")
    try:
        await pipeline.run()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await watch.stop()
        if server is not None:
            await server.stop()


def _serve_http(args: argparse.Namespace) -> int:
    """`clef-router serve`: the HTTP API alone (no Kafka), same settings and engine as `run`."""
    from consumer.logging import configure_logging, get_logger

    settings = _settings(args)
    if not args.stub_engine:
        _check_engine_settings(settings.engine)
    configure_logging(settings.log_level)
    log = get_logger("consumer.service")
    log.info("settings", settings=settings.masked())
    engine = _load_engine(settings, stub=args.stub_engine)
    log.info("engine_loaded", stub=args.stub_engine, device=settings.engine.device)
    try:
        asyncio.run(_serve_http_async(settings, engine))
    except OSError as exc:
        raise CommandError(f"cannot serve HTTP on {settings.http.host}:{settings.http.port}: {exc}") from exc
    return 0


async def _serve_http_async(settings: Any, engine: Any) -> None:
    from consumer.http import create_app
    from consumer.http_server import HttpServer
    from consumer.runtime import tune_gc
    from consumer.serve import HttpService

    service = HttpService(settings, engine)
    server = HttpServer(
        settings.http, create_app(settings.http, service, service.metrics, settings.engine.model_name)
    )
    await service.start()
    await server.start()
    tune_gc(settings.gc_gen0_threshold, freeze=settings.gc_freeze)
    stopping = asyncio.Event()

    def stop() -> None:
        service.request_stop()
        server.request_stop()
        stopping.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    await stopping.wait()
    await server.stop()  # requests in progress finish on the still running batcher
    await service.close(settings.http.shutdown_timeout_s)


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
