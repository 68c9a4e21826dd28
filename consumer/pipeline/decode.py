"""Kafka record value -> SystemOne request (CPU only; runs in the prepare thread pool).

`decode_value` applies the size limit, parses JSON once, and hands the object to `schemas.envelope.to_request`
(SystemOne body when it has `questions`, otherwise an event under the default schema). Every failure is a
`RequestError` with a stable `DlqReason`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import pydantic_core
from pydantic import JsonValue

from schemas.envelope import MEDIA_KEYS, DefaultSchema, to_request
from schemas.errors import DlqReason, RequestError
from schemas.parse import RequestLimits, check_value_size
from schemas.systemone import SystemOneRequest

EVENT_ID_FIELDS = ("event_id", "id", "eventId")
CE_ID_HEADER = "ce_id"
MAX_EVENT_ID_CHARS = 200


@dataclass(frozen=True, slots=True)
class Decoded:
    """A valid request plus the event id found in the value (None when it has none)."""

    request: SystemOneRequest
    event_id: str | None


def decode_value(value: bytes | None, schema: DefaultSchema, limits: RequestLimits) -> Decoded:
    """Decode one record value (pure, thread-safe). Raises `RequestError` only.

    Reasons: `empty_value` (tombstone or zero bytes), `value_too_large`, `bad_json`, `not_an_object`,
    `schema_violation`.
    """
    if value is None:
        raise RequestError(DlqReason.empty_value, "value is empty (tombstone)")
    check_value_size(value, limits)
    if len(value) == 0:
        raise RequestError(DlqReason.empty_value, "value is empty")
    try:
        obj = pydantic_core.from_json(value)
    except ValueError as exc:
        raise RequestError(DlqReason.bad_json, f"Invalid JSON: {str(exc)[:120]}") from None
    except RecursionError:
        raise RequestError(DlqReason.bad_json, "value is nested too deeply") from None
    if type(obj) is not dict and not isinstance(obj, Mapping):
        raise RequestError(DlqReason.not_an_object, "record value must be a JSON object")
    if "questions" not in obj and obj.keys().isdisjoint(MEDIA_KEYS):
        # A plain event without media: the state is a JSON object by construction and the questions come
        # from the (validated) default schema, so validation could not fail; skip it (hot path).
        state = cast(dict[str, JsonValue], obj)
        request = _template(schema).model_copy(update={"state": state})
        return Decoded(request, _event_id(obj))
    return Decoded(to_request(obj, schema, limits), _event_id(obj))


_TEMPLATES: dict[int, tuple[DefaultSchema, SystemOneRequest]] = {}


def _template(schema: DefaultSchema) -> SystemOneRequest:
    """The default-schema request with an empty state, built once per schema object: a plain event's
    request is a copy of it with the event as state (`model_copy` is about half the cost of
    `model_construct`). Thread-safe: a race builds the same template twice."""
    hit = _TEMPLATES.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    template = SystemOneRequest.model_construct(model=schema.model, state={}, questions=schema.questions)
    if len(_TEMPLATES) > 64:  # schemas are few (one per settings object); never grow without bound
        _TEMPLATES.clear()
    _TEMPLATES[id(schema)] = (schema, template)
    return template


def _event_id(obj: Mapping[str, object]) -> str | None:
    for name in EVENT_ID_FIELDS:
        found = obj.get(name)
        if isinstance(found, str | int) and not isinstance(found, bool) and str(found):
            return str(found)[:MAX_EVENT_ID_CHARS]
    return None


def header_event_id(headers: Sequence[tuple[str, bytes | None]]) -> str | None:
    """The CloudEvents `ce_id` header as text, if present and UTF-8."""
    for name, raw in headers:
        if name == CE_ID_HEADER and raw:
            try:
                return raw.decode("utf-8")[:MAX_EVENT_ID_CHARS]
            except UnicodeDecodeError:
                return None
    return None
