"""JSON Schema export of the wire contract (`clef-router schema` prints it)."""

from __future__ import annotations

from typing import Any

from schemas.request import SystemOneRequest
from schemas.response import SystemOneResponse
from schemas.routing import RoutedDecision


def json_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schemas (draft 2020-12) keyed by name: "request" (what clients send, validation view),
    "response" and "decision" (what the service emits, serialisation view)."""
    return {
        "request": SystemOneRequest.model_json_schema(mode="validation"),
        "response": SystemOneResponse.model_json_schema(mode="serialization"),
        "decision": RoutedDecision.model_json_schema(mode="serialization"),
    }
