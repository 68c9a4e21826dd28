"""Parsing a SystemOne request from wire bytes, text or a Python mapping, with size limits.

Every failure is a `RequestError` with a stable reason (never another exception type): the HTTP layer
turns it into a 4xx body and the Kafka pipeline into a DLQ record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from schemas.errors import DlqReason, RequestError
from schemas.request import SystemOneRequest

MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Size limits applied before and during parsing (SPEC section 6; configurable).

    `max_value_bytes`: largest accepted message value / HTTP body in bytes (UTF-8 for text input),
    checked before any JSON parsing.
    """

    max_value_bytes: int = 32 * MIB

    def __post_init__(self) -> None:
        if self.max_value_bytes <= 0:
            raise ValueError("max_value_bytes must be positive")


DEFAULT_LIMITS: Final = RequestLimits()


def _utf8_size_exceeds(text: str, limit: int) -> bool:
    # A character is 1..4 UTF-8 bytes: decide from the length alone when possible.
    if len(text) > limit:
        return True
    if len(text) * 4 <= limit:
        return False
    return len(text.encode("utf-8", errors="surrogatepass")) > limit


def check_value_size(
    value: bytes | bytearray | memoryview | str, limits: RequestLimits = DEFAULT_LIMITS
) -> None:
    """Raise `RequestError(value_too_large)` when `value` is over `limits.max_value_bytes`."""
    limit = limits.max_value_bytes
    too_large = (
        _utf8_size_exceeds(value, limit) if isinstance(value, str) else memoryview(value).nbytes > limit
    )
    if too_large:
        raise RequestError(DlqReason.value_too_large, f"value is larger than {limit} bytes")


def error_from_validation(exc: ValidationError) -> RequestError:
    """Map a pydantic error from validating a request to the right `RequestError`.

    Invalid JSON (including invalid UTF-8, lone surrogates, over-deep nesting) -> 400 `bad_json`;
    a top-level value that is not an object -> 400 `not_an_object`; anything else -> 422
    `schema_violation` with the sanitised `{type, loc, msg}` list.
    """
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0] if errors else None
    if first is not None and first["type"] == "json_invalid":
        return RequestError(DlqReason.bad_json, str(first["msg"]))
    if first is not None and first["type"] in {"model_type", "model_attributes_type"} and not first["loc"]:
        return RequestError(DlqReason.not_an_object, "request body must be a JSON object")
    return RequestError(
        DlqReason.schema_violation,
        f"request does not match the SystemOne schema ({exc.error_count()} errors)",
        errors=errors,
    )


def parse_request(
    value: bytes | bytearray | memoryview | str | Mapping[str, Any] | SystemOneRequest | None,
    limits: RequestLimits = DEFAULT_LIMITS,
) -> SystemOneRequest:
    """Validate a SystemOne request body. Pure and thread-safe; CPU cost linear in the value size.

    bytes/str are JSON (size-checked first); a Mapping is a decoded body from a Python caller (no size
    check; media items may be non-str objects); a `SystemOneRequest` is returned as is.
    Raises `RequestError` only: `empty_value` (None or zero bytes), `value_too_large`, `bad_json`,
    `not_an_object`, `schema_violation`.
    """
    if isinstance(value, SystemOneRequest):
        return value
    if value is None:
        raise RequestError(DlqReason.empty_value, "value is empty (tombstone)")
    try:
        if isinstance(value, bytes | bytearray | memoryview | str):
            check_value_size(value, limits)
            data = bytes(value) if isinstance(value, memoryview) else value
            if len(data) == 0:
                raise RequestError(DlqReason.empty_value, "value is empty")
            return SystemOneRequest.model_validate_json(data)
        if isinstance(value, Mapping):
            return SystemOneRequest.model_validate(dict(value))
    except ValidationError as exc:
        raise error_from_validation(exc) from None
    except RecursionError:
        raise RequestError(DlqReason.bad_json, "value is nested too deeply") from None
    raise RequestError(DlqReason.not_an_object, f"request must be a JSON object, not {type(value).__name__}")
