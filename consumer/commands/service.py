"""`clef-router run` and `serve`: the service, with Kafka and HTTP or HTTP alone.

`serve` is the HTTP API alone (no Kafka): same settings and engine; SIGTERM or SIGINT stops accepting,
lets requests in progress finish (up to `http.shutdown_timeout_s`), then exits 0.
`run` loads settings (env `CLEF_*`, optional `--config` TOML), prints them masked, loads the engine (a
release directory, or `--stub-engine` for demos and benchmarks: `devtools.stub`, imported only then),
then serves Kafka and HTTP until SIGTERM or SIGINT: stop fetching, drain, commit, exit 0. A fatal error
(DLQ guard, exhausted retries) exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from consumer.commands import CommandError, Commands, UsageError
from consumer.commands.client import error_text, load_cli_settings

if TYPE_CHECKING:
    from consumer.settings import EngineSettings, Settings
    from devtools.stub import StubEngine
    from engine.runner import Engine
    from engine.types import PreparedLike, ServingEngine

P = TypeVar("P", bound="PreparedLike")
S = TypeVar("S")
R = TypeVar("R")


def register(commands: Commands) -> None:
    """Add `run` and `serve`."""
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
    serving = (
        _serve(settings, _stub_engine(settings))
        if args.stub_engine
        else _serve(settings, _load_engine(settings))
    )
    log.info(
        "engine_loaded",
        stub=args.stub_engine,
        device=settings.engine.device,
        device_index=settings.engine.device_index,
    )
    try:
        asyncio.run(serving)
    except Exception as exc:
        log.error("service_failed", error=repr(exc)[:300])
        raise CommandError(f"service stopped: {error_text(exc)}") from exc
    return 0


def _check_engine_settings(e: EngineSettings) -> None:
    """Raise `UsageError` (exit 2: a permanent error, restarting cannot help) for a missing release
    directory, for `cuda` on a machine without CUDA, and for sm90 expert kernels that cannot run here
    (before minutes of loading weights)."""
    if e.model_path is None:
        raise UsageError("set CLEF_ENGINE__MODEL_PATH (a release directory) or pass --stub-engine")
    if not e.model_path.is_dir():
        raise UsageError(
            f"CLEF_ENGINE__MODEL_PATH={e.model_path} is not a directory "
            "(a Clef-omni release, or one written by 'clef-router make-tiny-release DIR')"
        )
    from engine.device import cuda_available

    if str(e.device).startswith("cuda") and not cuda_available():
        raise UsageError(
            f"CLEF_ENGINE__DEVICE={e.device} but this machine has no usable CUDA GPU; "
            "set CLEF_ENGINE__DEVICE=cpu (and CLEF_ENGINE__DTYPE=float32) to run on the CPU"
        )
    if e.sm90_experts and (e.fp8_experts or e.fp8_text_only) and str(e.device).startswith("cuda"):
        import torch

        from consumer.settings import SettingsError, engine_device
        from engine.kernels.moe_fp8_sm90 import problem_for

        try:
            device = torch.device(engine_device(e))
        except SettingsError as exc:
            raise UsageError(str(exc)) from exc
        if problem := problem_for(device):
            raise UsageError(f"CLEF_ENGINE__SM90_EXPERTS=true, but {problem}")


def _load_engine(settings: Settings) -> Engine:
    """The engine for `run` and `serve` (blocking: loads the weights). Raises `UsageError` for a release
    that cannot be read (see `_check_engine_settings` for the checks made before)."""
    from consumer.engine_config import engine_config
    from consumer.settings import SettingsError
    from engine.kernels.moe_fp8_sm90 import Sm90UnavailableError
    from engine.model.release import ReleaseError
    from engine.runner import Engine

    e = settings.engine
    try:
        config = engine_config(e, settings.batching)
    except SettingsError as exc:
        raise UsageError(str(exc)) from exc
    if e.device_index is not None:
        from engine.device import use_device

        use_device(config.device)  # cuda:N: kernels and CUDA graphs with no explicit device use it
    assert e.model_path is not None  # checked by _check_engine_settings
    try:
        return Engine.from_release(e.model_path, config=config)
    except (ReleaseError, FileNotFoundError) as exc:
        raise UsageError(f"cannot load the release in {e.model_path}: {error_text(exc)}") from exc
    except Sm90UnavailableError as exc:
        raise UsageError(f"CLEF_ENGINE__SM90_EXPERTS=true, but {exc}") from exc


def _stub_engine(settings: Settings) -> StubEngine:
    """`--stub-engine`: the dev tool's engine that answers instantly, within the configured batch limits
    (imported only for this flag)."""
    from consumer.commands.checkout import require_dev_package

    require_dev_package("devtools", "--stub-engine")
    from devtools.stub import StubEngine

    return StubEngine(settings.batching.limits)


async def _serve(settings: Settings, engine: ServingEngine[P, S, R]) -> None:
    """Kafka and HTTP on one loop. SIGTERM/SIGINT: the HTTP server stops accepting and lets requests in
    progress finish while the pipeline drains (HTTP requests already in the batcher are answered)."""
    from consumer.http.backends import ServiceBackend, http_server
    from consumer.kafka.broker_watch import BrokerWatch
    from consumer.loop_lag import LoopLagSampler
    from consumer.pipeline.pipeline import Pipeline

    pipeline = Pipeline(settings, engine)
    watch = BrokerWatch(settings.kafka, pipeline.metrics, settings.http.broker_unreachable_s)
    lag = LoopLagSampler.into(pipeline.metrics.loop_lag)
    lag.start()
    server = None
    if settings.http.enabled:
        server = http_server(settings, ServiceBackend(pipeline, watch), pipeline.metrics)
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
        await lag.stop()


def _serve_http(args: argparse.Namespace) -> int:
    """`clef-router serve`: the HTTP API alone (no Kafka), same settings and engine as `run`."""
    from consumer.logging import configure_logging, get_logger

    settings = _settings(args)
    if not args.stub_engine:
        _check_engine_settings(settings.engine)
    configure_logging(settings.log_level)
    log = get_logger("consumer.service")
    log.info("settings", settings=settings.masked())
    serving = (
        _serve_http_async(settings, _stub_engine(settings))
        if args.stub_engine
        else _serve_http_async(settings, _load_engine(settings))
    )
    log.info("engine_loaded", stub=args.stub_engine, device=settings.engine.device)
    try:
        asyncio.run(serving)
    except OSError as exc:
        raise CommandError(f"cannot serve HTTP on {settings.http.host}:{settings.http.port}: {exc}") from exc
    return 0


async def _serve_http_async(settings: Settings, engine: ServingEngine[P, S, R]) -> None:
    from consumer.http.backends import HttpService, http_server
    from consumer.loop_lag import LoopLagSampler
    from consumer.runtime import tune_process

    service = HttpService(settings, engine)
    server = http_server(settings, service, service.metrics)
    lag = LoopLagSampler.into(service.metrics.loop_lag)
    lag.start()
    await service.start()
    await server.start()
    tune_process(settings)
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
    await lag.stop()
