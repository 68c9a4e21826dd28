"""Stable reason codes and the client-error type shared by HTTP answers and dead-letter records.

A `RequestError` is a *permanent* failure of one request: retrying the same bytes can never succeed.
It carries a `DlqReason` (the stable code written to `clef-dlq-reason` and the DLQ metric label), an
HTTP status (422 for schema violations, 400 for other client errors) and a short message that never
contains payload data, so it is safe to log at info level and to put into a Kafka header.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

MAX_MESSAGE_CHARS = 200
"""Longest message kept in a `RequestError` (and in the `kafka_dlt-exception-message` header)."""

MAX_ERROR_ITEMS = 20
"""Longest `{"detail": [...]}` list a 422 body carries; further errors are dropped."""

_MAX_LOC_CHARS = 64
_MAX_MSG_CHARS = 200


class DlqReason(StrEnum):
    """Why a record could not be answered. Values are stable: dashboards and replays key on them."""

    # Decoding the record value (HTTP body / Kafka value).
    empty_value = "empty_value"  # Kafka tombstone or empty HTTP body
    value_too_large = "value_too_large"
    bad_json = "bad_json"
    not_an_object = "not_an_object"
    schema_violation = "schema_violation"
    # Encoding (SPEC section 5).
    context_length_exceeded = "context_length_exceeded"
    # Media (SPEC section 6); every refusal has its own code.
    media_bad_source = "media_bad_source"
    media_forbidden_url = "media_forbidden_url"
    media_forbidden_path = "media_forbidden_path"
    media_fetch_failed = "media_fetch_failed"
    media_too_large = "media_too_large"
    media_too_long = "media_too_long"
    media_bomb = "media_bomb"
    media_undecodable = "media_undecodable"
    # Engine: the model failed on this record alone (e.g. CUDA OOM even for a batch of one).
    oom_single_record = "oom_single_record"
    engine_failed = "engine_failed"


_STATUS: Mapping[DlqReason, int] = {
    DlqReason.schema_violation: 422,
    DlqReason.oom_single_record: 500,
    DlqReason.engine_failed: 500,
}


def status_for(reason: DlqReason) -> int:
    """HTTP status for a reason: 422 schema violations, 500 engine failures, 400 every other client error."""
    return _STATUS.get(reason, 400)


def short_text(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` cut to `limit` characters (an ellipsis marks the cut); control characters become spaces."""
    cleaned = "".join(ch if ch.isprintable() else " " for ch in text[: limit + 1])
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


class RequestError(Exception):
    """A permanent, client-caused failure of one request.

    `reason` is the stable code, `status` the HTTP status (defaults from the reason), `message` a short
    payload-free text, `errors` the sanitised pydantic error list for 422 schema violations (else None).
    `body()` is the HTTP/JSON error body: `{"detail": [{"type", "loc", "msg"}, ...]}` when `errors` is
    set, otherwise `{"detail": {"error_type": reason, "message": message}}`.
    """

    reason: DlqReason
    status: int
    message: str
    errors: list[dict[str, Any]] | None

    def __init__(
        self,
        reason: DlqReason,
        message: str,
        *,
        status: int | None = None,
        errors: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.reason = DlqReason(reason)
        self.status = status if status is not None else status_for(self.reason)
        self.message = short_text(message)
        self.errors = None if errors is None else sanitize_errors(errors)
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        """The JSON error body (see the class docstring); never contains request payload."""
        if self.errors is not None:
            return {"detail": [dict(item) for item in self.errors]}
        return {"detail": {"error_type": self.reason.value, "message": self.message}}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reason.value!r}, {self.message!r}, status={self.status})"


def _loc_item(item: object) -> str | int:
    if isinstance(item, int) and not isinstance(item, bool):
        return item
    return short_text(str(item), _MAX_LOC_CHARS)


def _message(error: Mapping[str, Any]) -> str:
    # Pydantic quotes the offending tag in this message; rebuild it from the expected tags instead.
    ctx = error.get("ctx")
    if error.get("type") == "union_tag_invalid" and isinstance(ctx, Mapping) and "expected_tags" in ctx:
        return f"Input tag does not match any of the expected tags: {ctx['expected_tags']}"
    return str(error.get("msg", ""))


def sanitize_errors(errors: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic-style error dicts reduced to `{type, loc, msg}`: `input`/`ctx`/`url` dropped, location
    parts and messages shortened (ids and tags in them come from the request), at most
    `MAX_ERROR_ITEMS` entries."""
    out: list[dict[str, Any]] = []
    for error in errors:
        if len(out) >= MAX_ERROR_ITEMS:
            break
        out.append(
            {
                "type": short_text(str(error.get("type", "value_error")), _MAX_LOC_CHARS),
                "loc": [_loc_item(part) for part in error.get("loc", ())],
                "msg": short_text(_message(error), _MAX_MSG_CHARS),
            }
        )
    return out
