"""`clef-router produce` and `clef-router dlq replay`: records into Kafka, bounded and interruptible.

Both load settings like `run` (env `CLEF_*`, `--config`, `--bootstrap`) and talk to the broker through
`consumer.commands.client.run_client`: `--timeout` seconds at most (default 30) when the broker does not
answer, Ctrl-C at once, one-line errors. `dlq replay --dry-run` reports `would_replay` (nothing is sent).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from consumer.commands import Commands, UsageError
from consumer.commands.client import DEFAULT_TIMEOUT_S, load_cli_settings, run_client, started

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "events.jsonl"
_settings = load_cli_settings


def register(commands: Commands) -> None:
    """Add `produce` and `dlq replay`."""
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
    from consumer.kafka_access import ensure_topics
    from consumer.producer import Producer
    from consumer.router import OutRecord

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
