"""``clef-router schema``: print the JSON Schemas of the wire formats.

Output (stdout): one JSON object keyed by name, ``{"request": ..., "response": ..., "decision": ...}``
(SystemOne request body, SystemOne response body, routed decision record), or one schema with ``--which``.
The schemas come from ``schemas.export.json_schemas()``; without that module, from the pydantic models.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Mapping
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
    """Return the JSON Schemas keyed by name (at least ``request`` and ``response``)."""
    try:
        export = importlib.import_module("schemas.export")
    except ModuleNotFoundError as exc:
        if exc.name != "schemas.export":
            raise
    else:
        func = getattr(export, "json_schemas", None)
        if callable(func):
            found = func()
            if isinstance(found, Mapping):
                return dict(found)
    from schemas.systemone import SystemOneRequest, SystemOneResponse

    return {
        "request": SystemOneRequest.model_json_schema(mode="validation"),
        "response": SystemOneResponse.model_json_schema(mode="serialization"),
    }


def _schema(args: argparse.Namespace) -> int:
    if args.indent < 0:
        raise UsageError("--indent must be 0 or more")
    schemas = json_schemas()
    if args.which != "all" and args.which not in schemas:
        raise UsageError(f"no {args.which!r} schema is available (have: {', '.join(schemas)})")
    out: Any = schemas if args.which == "all" else schemas[args.which]
    print(json.dumps(out, indent=args.indent or None, ensure_ascii=False))
    return 0
