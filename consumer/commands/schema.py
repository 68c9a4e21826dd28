"""``clef-router schema``: print the JSON Schemas of the wire formats.

Output (stdout): one JSON object keyed by name, ``{"request": ..., "response": ..., "decision": ...}``
(SystemOne request body, SystemOne response body, routed decision record), or one schema with ``--which``.
The schemas come from ``schemas.export.json_schemas()``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from consumer.commands import Commands, UsageError


def register(commands: Commands) -> None:
    """Add ``schema``."""
    p = commands.add_parser("schema", help="Print the JSON Schemas of SystemOne requests and responses")
    p.add_argument(
        "--which",
        choices=("all", "request", "response", "decision"),
        default="all",
        help="which schema to print (default: all, as one object keyed by name)",
    )
    p.add_argument("--indent", type=int, default=2, help="JSON indentation (0 = one line)")
    p.set_defaults(func=_schema)


def json_schemas() -> dict[str, Any]:
    """Return the JSON Schemas keyed by name (`request`, `response`, `decision`)."""
    from schemas.export import json_schemas as exported

    return dict(exported())


def _schema(args: argparse.Namespace) -> int:
    if args.indent < 0:
        raise UsageError("--indent must be 0 or more")
    schemas = json_schemas()
    if args.which != "all" and args.which not in schemas:
        raise UsageError(f"no {args.which!r} schema is available (have: {', '.join(schemas)})")
    out: Any = schemas if args.which == "all" else schemas[args.which]
    print(json.dumps(out, indent=args.indent or None, ensure_ascii=False))
    return 0
