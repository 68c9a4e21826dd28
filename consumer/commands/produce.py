"""`clef-router produce`: the sample alert/fault events (or a JSON lines file) into the input topic.

Loads settings like `run` (env `CLEF_*`, `--config`, `--bootstrap`) and talks to the broker through
`consumer.commands.client.run_client`: `--timeout` seconds at most (default 30) when the broker does not
answer, Ctrl-C at once, one-line errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from consumer.commands import Commands, UsageError
from consumer.commands.client import add_kafka_options, load_cli_settings, run_client, started

if TYPE_CHECKING:
    from consumer.settings import Settings

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "events.jsonl"
_settings = load_cli_settings


def register(commands: Commands) -> None:
    """Add `produce`."""
    p = commands.add_parser("produce", help="Send the sample alert/fault events to the input topic")
    add_kafka_options(p)
    p.add_argument("--topic", default=None, help="topic to send to (default: the first input topic)")
    p.add_argument("--file", type=Path, default=SAMPLES, help="JSON lines of {key, headers, value}")
    p.add_argument("--repeat", type=int, default=1, help="send the whole file this many times")
    p.set_defaults(func=_produce)


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


async def _send_samples(settings: Settings, topic: str, items: list[dict[str, Any]]) -> int:
    from consumer.kafka.access import ensure_topics
    from consumer.kafka.producer import Producer
    from consumer.records import OutRecord

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
