"""`clef-router run`, `serve`, `produce`, `tail`, `dlq replay` and `bench pipeline`.

`serve` is the HTTP API alone (no Kafka): same settings and engine; SIGTERM or SIGINT stops accepting,
lets requests in progress finish (up to `http.shutdown_timeout_s`), then exits 0.
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

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "events.jsonl"


def register(commands: Commands) -> None:
    """Add `run`, `serve`, `produce`, `tail`, `dlq replay` and `bench pipeline`."""
    p = commands.add_parser("run", help="Run the Kafka routing service and its HTTP server")
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

    p = commands.add_parser("produce", help="Send the sample alert/fault events to the input topic")
    p.add_argument("--config", type=Path, default=None)
    p.add_argument("--bootstrap", default=None, help="override kafka.bootstrap_servers")
    p.add_argument("--topic", default=None, help="default: the first input topic")
    p.add_argument("--file", type=Path, default=SAMPLES, help="JSON lines of {key, headers, value}")
    p.add_argument("--repeat", type=int, default=1, help="send the whole file this many times")
    p.set_defaults(func=_produce)

    dlq = commands.group("dlq", "Dead-letter topic tools")
    p = dlq.add_parser("replay", help="Send DLQ records back to their original topic")
    p.add_argument("--config", type=Path, default=None)
    p.add_argument("--bootstrap", default=None, help="override kafka.bootstrap_servers")
    p.add_argument("--reason", action="append", default=[], help="only this reason code (repeatable)")
    p.add_argument("--limit", type=int, default=None, help="replay at most this many records")
    p.add_argument("--group", default=None, help="replay consumer group (default: <group_id>.dlq-replay)")
    p.add_argument("--dry-run", action="store_true", help="count only; send and commit nothing")
    p.set_defaults(func=_dlq_replay)

    p = commands.add_parser("tail", help="Print routed decisions (department, urgency, outage) from a topic")
    p.add_argument("--config", type=Path, default=None)
    p.add_argument("--bootstrap", default=None, help="override kafka.bootstrap_servers")
    p.add_argument("--topic", default=None, help="default: the decisions topic")
    p.add_argument("--count", type=int, default=20, help="stop after this many decisions")
    p.add_argument("--timeout", type=float, default=10.0, help="stop after this many seconds without news")
    p.set_defaults(func=_tail)

    p = commands.bench.add_parser("pipeline", help="Service events/s (stub engine) vs a plain aiokafka loop")
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=3)
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


def _settings(args: argparse.Namespace, **overrides: Any) -> Any:
    from consumer.settings import SettingsError, load_settings

    if getattr(args, "bootstrap", None):
        overrides.setdefault("kafka", {})["bootstrap_servers"] = args.bootstrap
    try:
        return load_settings(args.config, **overrides)
    except SettingsError as exc:
        raise UsageError(str(exc)) from exc


def _run(args: argparse.Namespace) -> int:
    from consumer.logging import configure_logging, get_logger

    settings = _settings(args)
    configure_logging(settings.log_level)
    log = get_logger("consumer.service")
    log.info("settings", settings=settings.masked())
    engine = _load_engine(settings, stub=args.stub_engine)
    log.info("engine_loaded", stub=args.stub_engine, device=settings.engine.device)
    try:
        asyncio.run(_serve(settings, engine))
    except Exception as exc:
        log.error("service_failed", error=repr(exc)[:300])
        raise CommandError(f"service stopped: {type(exc).__name__}: {exc}") from exc
    return 0


def _load_engine(settings: Any, *, stub: bool) -> Any:
    if stub:
        from bench.stub import StubEngine

        return StubEngine()
    if settings.engine.model_path is None:
        raise UsageError("set CLEF_ENGINE__MODEL_PATH (a release directory) or pass --stub-engine")
    from engine.runner import Engine, EngineConfig

    e = settings.engine
    config = EngineConfig(
        device=e.device,
        dtype=e.dtype,
        max_batch_tokens=settings.batching.max_batch_tokens,
        max_batch_records=settings.batching.max_batch_records,
        max_tokens=e.max_input_tokens,
        truncate_state=e.truncate_state,
        confidence_formula=e.confidence_formula,
    )
    return Engine.from_release(e.model_path, config=config)


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
    await watch.start()
    try:
        await pipeline.run()
    finally:
        await watch.stop()
        if server is not None:
            await server.stop()


def _serve_http(args: argparse.Namespace) -> int:
    """`clef-router serve`: the HTTP API alone (no Kafka), same settings and engine as `run`."""
    from consumer.logging import configure_logging, get_logger

    settings = _settings(args)
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


def _produce(args: argparse.Namespace) -> int:
    settings = _settings(args)
    topic = args.topic or settings.topics.input[0]
    try:
        lines = [json.loads(line) for line in args.file.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read samples from {args.file}: {exc}") from exc
    sent = asyncio.run(_send_samples(settings, topic, lines * max(1, args.repeat)))
    print(f"sent {sent} events to {topic} at {settings.kafka.bootstrap_servers}")
    return 0


async def _send_samples(settings: Any, topic: str, items: list[dict[str, Any]]) -> int:
    from consumer.kafka_access import ensure_topics
    from consumer.producer import Producer
    from consumer.router import OutRecord

    await ensure_topics(settings.kafka, [topic])
    producer = Producer(settings.kafka)
    await producer.start()
    try:
        futures = []
        for item in items:
            key = str(item["key"]).encode() if item.get("key") is not None else None
            headers = tuple((str(k), str(v).encode()) for k, v in (item.get("headers") or {}).items())
            value = json.dumps(item["value"]).encode()
            futures.append(await producer.send(OutRecord(topic, key, value, headers)))
        await asyncio.gather(*futures)
        return len(futures)
    finally:
        await producer.stop()


def _dlq_replay(args: argparse.Namespace) -> int:
    from consumer.dlq import reason_filter, replay

    settings = _settings(args)
    try:
        reasons = reason_filter(args.reason)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    group = args.group or f"{settings.kafka.group_id}.dlq-replay"
    counts = asyncio.run(
        replay(
            settings.kafka,
            settings.topics.dlq,
            group_id=group,
            reasons=reasons,
            limit=args.limit,
            dry_run=args.dry_run,
        )
    )
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


def _tail(args: argparse.Namespace) -> int:
    settings = _settings(args)
    topic = args.topic or settings.topics.decisions
    shown = asyncio.run(_tail_decisions(settings, topic, args.count, args.timeout))
    print(f"{shown} decisions from {topic}", file=sys.stderr)
    return 0


async def _tail_decisions(settings: Any, topic: str, count: int, timeout_s: float) -> int:
    """Print one line per decision record (from the beginning) until `count` or `timeout_s` without news."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from consumer.dlq import topic_partitions
    from consumer.kafka_config import client_options

    consumer = AIOKafkaConsumer(**client_options(settings.kafka), enable_auto_commit=False)
    await consumer.start()
    shown = 0
    try:
        parts = [TopicPartition(topic, p) for p in await topic_partitions(settings.kafka, topic)]
        if not parts:
            raise CommandError(f"topic {topic} does not exist")
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        idle_since = asyncio.get_running_loop().time()
        while shown < count and asyncio.get_running_loop().time() - idle_since < timeout_s:
            batch = await consumer.getmany(timeout_ms=500, max_records=count - shown)
            for records in batch.values():
                for rec in records:
                    shown += 1
                    idle_since = asyncio.get_running_loop().time()
                    print(_decision_line(rec.key, rec.value), flush=True)
    finally:
        await consumer.stop()
    return shown


def _decision_line(key: bytes | None, value: bytes | None) -> str:
    try:
        d = json.loads(value or b"")
        r = d.get("route", {})
        conf = r.get("department_confidence")
        urgency = r.get("urgency")
        outage = r.get("outage_probability")
        return (
            f"{(key or b'-').decode(errors='replace'):>10}  {d.get('event_id', '?'):<28} "
            f"department={r.get('department')} ({conf if conf is None else round(conf, 2)})  "
            f"urgency={r.get('urgency_label')} ({urgency if urgency is None else round(urgency, 2)})  "
            f"outage={r.get('outage')} ({outage})"
        )
    except (ValueError, AttributeError):
        return f"{key!r}: <not a decision record>"
