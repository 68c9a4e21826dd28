"""`clef-router dlq replay`: DLQ records back to their original topic (`consumer.kafka.dlq_replay`).

Loads settings like `run` (env `CLEF_*`, `--config`, `--bootstrap`) and talks to the broker through
`consumer.commands.client.run_client`: `--timeout` seconds at most (default 30) when the broker does not
answer, Ctrl-C at once, one-line errors. `--dry-run` reports `would_replay` (nothing is sent).
"""

from __future__ import annotations

import argparse
import json

from consumer.commands import Commands, UsageError
from consumer.commands.client import add_kafka_options, load_cli_settings, run_client

_settings = load_cli_settings


def register(commands: Commands) -> None:
    """Add `dlq replay`."""
    dlq = commands.group("dlq", "Dead-letter topic tools")
    p = dlq.add_parser(
        "replay",
        help="Send DLQ records back to their original topic",
        description="Send DLQ records back to their original topic (original value, key and headers).",
    )
    add_kafka_options(p)
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


def _reason_codes() -> list[str]:
    from schemas.errors import DlqReason

    return [r.value for r in DlqReason]


def _dlq_replay(args: argparse.Namespace) -> int:
    from consumer.kafka.dlq_replay import reason_filter, replay

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
