"""`clef-router tail`: print the records of a decisions, route or dead-letter topic, one line each.

Start position: the newest `--count` records of the topic (all partitions, in timestamp order), or every
record from the oldest with `--from-beginning`. Without `--follow` the command stops at the end offsets
read when it started; with `--follow` it then prints new records until Ctrl-C. `--max N` stops after N
lines in total; `--timeout S` gives up after S seconds (exit 1 when `--max` was not reached).

Lines (stdout): a decision shows its key, event id, the route topic it went to and why (the routing
confidence against the review threshold), urgency and outage; a dead-letter record shows its reason code,
stage, original topic/partition/offset and message. A summary line goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from consumer.commands import CommandError, Commands, UsageError
from consumer.commands.client import DEFAULT_TIMEOUT_S, load_cli_settings, run_client, started, unreachable


def register(commands: Commands) -> None:
    """Add `tail`."""
    p = commands.add_parser(
        "tail", help="Print the newest decisions (with their route topic) or dead-letter records of a topic"
    )
    p.add_argument("--config", type=Path, default=None, help="TOML settings file (env CLEF_* overrides it)")
    p.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default: the settings')")
    p.add_argument("--topic", default=None, help="topic to read (default: the decisions topic)")
    p.add_argument("--count", type=int, default=20, help="start with the newest N records (default 20)")
    p.add_argument(
        "--from-beginning", action="store_true", help="start with the oldest record instead (ignores --count)"
    )
    p.add_argument("--follow", action="store_true", help="then keep printing new records until Ctrl-C")
    p.add_argument("--max", type=int, default=None, metavar="N", help="stop after printing N records")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"give up after this many seconds (default {DEFAULT_TIMEOUT_S:g}; with --follow: none)",
    )
    p.set_defaults(func=_tail)


def _tail(args: argparse.Namespace) -> int:
    if args.count < 0 or (args.max is not None and args.max < 1):
        raise UsageError("--count must be >= 0 and --max >= 1")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    settings = load_cli_settings(args)
    topic = args.topic or settings.topics.decisions
    timeout = args.timeout if args.timeout is not None else (None if args.follow else DEFAULT_TIMEOUT_S)
    printer = _Printer(settings, topic)
    bootstrap = settings.kafka.bootstrap_servers
    try:
        run_client(
            lambda: _read(settings, topic, args, printer, timeout), bootstrap=bootstrap, timeout_s=None
        )
    except TimeoutError:
        wanted = f"{printer.shown} of {args.max}" if args.max is not None else str(printer.shown)
        raise CommandError(f"gave up after {timeout:g} s with {wanted} records from {topic}") from None
    print(f"{printer.shown} records from {topic}", file=sys.stderr)
    return 0


async def _read(
    settings: Any, topic: str, args: argparse.Namespace, printer: _Printer, timeout_s: float | None
) -> None:
    """Assign every partition of `topic`, seek, and print; raises `TimeoutError` when `timeout_s` ran out
    after the broker answered (an unreachable broker is `BrokerUnreachableError`)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from consumer.kafka.access import topic_partitions
    from consumer.kafka.config import client_options

    consumer = AIOKafkaConsumer(**client_options(settings.kafka), enable_auto_commit=False)
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    connect_s = min(timeout_s or DEFAULT_TIMEOUT_S, DEFAULT_TIMEOUT_S)
    bootstrap = settings.kafka.bootstrap_servers
    async with started(consumer, consumer.stop, bootstrap=bootstrap, timeout_s=connect_s):
        try:
            async with asyncio.timeout(connect_s):
                parts = [TopicPartition(topic, p) for p in await topic_partitions(settings.kafka, topic)]
                if not parts:
                    raise CommandError(f"topic {topic} does not exist at {bootstrap}")
                consumer.assign(parts)
                ends: dict[Any, int] = await consumer.end_offsets(parts)
                starts: dict[Any, int] = await consumer.beginning_offsets(parts)
        except TimeoutError as exc:
            raise unreachable(bootstrap, connect_s) from exc
        for tp in parts:
            first = starts[tp] if args.from_beginning else max(starts[tp], ends[tp] - args.count)
            consumer.seek(tp, first)
        try:
            async with asyncio.timeout_at(deadline):
                await _print_existing(consumer, parts, ends, args, printer)
                while args.follow and not printer.done(args.max):
                    batch = await consumer.getmany(timeout_ms=1000)
                    for records in batch.values():
                        for rec in records:
                            if printer.done(args.max):
                                return
                            printer.print(rec)
        except TimeoutError:
            if not args.follow or args.max is not None:
                raise  # the records asked for did not all come


async def _print_existing(
    consumer: Any, parts: list[Any], ends: dict[Any, int], args: argparse.Namespace, printer: _Printer
) -> None:
    """Print the records before `ends`: all of them in partition order with `--from-beginning`, else the
    newest `--count` in timestamp order."""
    todo = {tp for tp in parts if await consumer.position(tp) < ends[tp]}
    held: list[Any] = []
    while todo and not printer.done(args.max):
        batch = await consumer.getmany(*todo, timeout_ms=1000)
        for tp, records in batch.items():
            for rec in records:
                if rec.offset >= ends[tp]:
                    break
                if args.from_beginning:
                    if printer.done(args.max):
                        return
                    printer.print(rec)
                else:
                    held.append(rec)
        todo = {tp for tp in todo if await consumer.position(tp) < ends[tp]}
    held.sort(key=lambda r: (r.timestamp, r.partition, r.offset))
    for rec in held[-args.count :] if args.count else []:
        if printer.done(args.max):
            return
        printer.print(rec)


class _Printer:
    """Formats and prints records; `shown` counts the printed lines (event loop only)."""

    def __init__(self, settings: Any, topic: str) -> None:
        from consumer.pipeline.router import Router

        self._router = Router(settings.routing, settings.topics, b"")
        self._threshold = settings.routing.review_threshold
        self._topics = settings.topics
        self._topic = topic
        self.shown = 0

    def done(self, limit: int | None) -> bool:
        return limit is not None and self.shown >= limit

    def print(self, rec: Any) -> None:
        self.shown += 1
        print(self.line(rec.topic, rec.partition, rec.offset, rec.key, rec.value, rec.headers), flush=True)

    def line(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Any,
    ) -> str:
        """One line for a record: a dead letter (by its headers), a decision (by its value), or neither."""
        from schemas.dead_letter import DlqHeaderError, parse_dlq_headers

        where = f"{topic}[{partition}]@{offset}"
        name = (key or b"-").decode(errors="replace")
        try:
            info = parse_dlq_headers([(k, bytes(v) if v is not None else None) for k, v in headers or ()])
        except DlqHeaderError:
            pass
        else:
            return (
                f"{where}  key={name}  reason={info.reason.value}  stage={info.stage}  "
                f"from={info.original_topic}[{info.original_partition}]@{info.original_offset}  "
                f"attempts={info.attempts}  {info.exception_message}"
            )
        try:
            decision = json.loads(value or b"")
            route = decision["route"]
            routed = topic if topic != self._topics.decisions else self._router.topic(route)
        except (ValueError, KeyError, TypeError):
            return f"{where}  key={name}  (not a decision or dead-letter record)"
        return (
            f"{name:>10}  {decision.get('event_id', '?'):<24} -> {routed:<16} {self._why(routed, route)}  "
            f"urgency={route.get('urgency_label')} ({_num(route.get('urgency'))})  "
            f"outage={route.get('outage')} ({_num(route.get('outage_probability'))})"
        )

    def _why(self, routed: str, route: dict[str, Any]) -> str:
        department, confidence = route.get("department"), route.get("department_confidence")
        if routed == self._topics.review and isinstance(confidence, float | int):
            return (
                f"department={department} confidence {_num(confidence)} "
                f"< review threshold {self._threshold:g}"
            )
        if routed == self._topics.unrouted:
            return f"department={department} maps to no route topic"
        return f"department={department} confidence {_num(confidence)}"


def _num(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, float | int) and not isinstance(value, bool) else str(value)
