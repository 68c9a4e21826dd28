"""Dead-letter records: reason codes and the SPEC section 7 header set, built and parsed back.

A DLQ record keeps the original value bytes, key and headers untouched and adds the headers below (all
values UTF-8 strings as bytes). `clef-router dlq replay` reads them back with `parse_dlq_headers` and
re-sends the record with `strip_dlq_headers(headers)`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from schemas.errors import MAX_MESSAGE_CHARS, DlqReason, RequestError, short_text

H_ORIGINAL_TOPIC: Final = "kafka_dlt-original-topic"
H_ORIGINAL_PARTITION: Final = "kafka_dlt-original-partition"
H_ORIGINAL_OFFSET: Final = "kafka_dlt-original-offset"
H_EXCEPTION_FQCN: Final = "kafka_dlt-exception-fqcn"
H_EXCEPTION_MESSAGE: Final = "kafka_dlt-exception-message"
H_REASON: Final = "clef-dlq-reason"
H_STAGE: Final = "clef-dlq-stage"
H_ATTEMPTS: Final = "clef-dlq-attempts"

DLQ_HEADER_NAMES: Final = (
    H_ORIGINAL_TOPIC,
    H_ORIGINAL_PARTITION,
    H_ORIGINAL_OFFSET,
    H_EXCEPTION_FQCN,
    H_EXCEPTION_MESSAGE,
    H_REASON,
    H_STAGE,
    H_ATTEMPTS,
)

Headers = Sequence[tuple[str, bytes | None]]


class DlqStage(StrEnum):
    """Where in the pipeline a record failed (`clef-dlq-stage`)."""

    decode = "decode"  # size, JSON, envelope and SystemOne validation
    media = "media"  # fetching / decoding attachments
    tokenize = "tokenize"  # encoding to tokens, context length
    engine = "engine"  # forward pass / building answers
    publish = "publish"  # routing and serialising the output records


_MEDIA_REASONS = frozenset(r for r in DlqReason if r.value.startswith("media_"))
_ENGINE_REASONS = frozenset({DlqReason.engine_failed, DlqReason.oom_single_record})


def stage_for(reason: DlqReason) -> str:
    """The pipeline stage a reason code belongs to (`clef-dlq-stage`). Pure."""
    if reason in _MEDIA_REASONS:
        return DlqStage.media.value
    if reason == DlqReason.context_length_exceeded:
        return DlqStage.tokenize.value
    if reason in _ENGINE_REASONS:
        return DlqStage.engine.value
    return DlqStage.decode.value


class DlqHeaderError(ValueError):
    """A header list lacks a DLQ header or has one that does not parse."""


@dataclass(frozen=True, slots=True)
class DeadLetterInfo:
    """Why and from where a record was dead-lettered. `exception_message` is short and payload-free."""

    original_topic: str
    original_partition: int
    original_offset: int
    reason: DlqReason
    stage: str
    attempts: int
    exception_fqcn: str
    exception_message: str

    @classmethod
    def from_exception(
        cls,
        exc: BaseException,
        *,
        topic: str,
        partition: int,
        offset: int,
        stage: str,
        attempts: int = 1,
        reason: DlqReason | None = None,
    ) -> DeadLetterInfo:
        """Describe `exc` for the DLQ. The reason is `reason`, else `exc.reason` for a `RequestError`,
        else `engine_failed`. The message is `RequestError.message` (built payload-free) or the first
        `MAX_MESSAGE_CHARS` characters of `str(exc)`; non-printable characters become spaces."""
        if reason is None:
            reason = exc.reason if isinstance(exc, RequestError) else DlqReason.engine_failed
        message = exc.message if isinstance(exc, RequestError) else str(exc) or type(exc).__name__
        return cls(
            original_topic=topic,
            original_partition=partition,
            original_offset=offset,
            reason=reason,
            stage=str(stage),
            attempts=attempts,
            exception_fqcn=exception_fqcn(exc),
            exception_message=short_text(message, MAX_MESSAGE_CHARS),
        )


def exception_fqcn(exc: BaseException) -> str:
    """Fully qualified class name of `exc`, e.g. `schemas.errors.RequestError` or `builtins.ValueError`."""
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"


def dlq_headers(info: DeadLetterInfo) -> list[tuple[str, bytes]]:
    """The SPEC section 7 DLQ headers for `info`, in `DLQ_HEADER_NAMES` order, values as UTF-8 bytes.
    Append them to the original headers (after `strip_dlq_headers`, so a replayed-then-failed record
    does not carry two sets)."""
    values = (
        info.original_topic,
        str(info.original_partition),
        str(info.original_offset),
        info.exception_fqcn,
        short_text(info.exception_message, MAX_MESSAGE_CHARS),
        info.reason.value,
        info.stage,
        str(info.attempts),
    )
    return [
        (name, value.encode("utf-8", errors="replace"))
        for name, value in zip(DLQ_HEADER_NAMES, values, strict=True)
    ]


def strip_dlq_headers(headers: Iterable[tuple[str, bytes | None]]) -> list[tuple[str, bytes | None]]:
    """`headers` without any DLQ header (order and duplicates of the others kept)."""
    names = set(DLQ_HEADER_NAMES)
    return [(name, value) for name, value in headers if name not in names]


def with_dlq_headers(
    original: Iterable[tuple[str, bytes | None]], info: DeadLetterInfo
) -> list[tuple[str, bytes | None]]:
    """Original headers (old DLQ headers removed) followed by the DLQ headers for `info`."""
    return [*strip_dlq_headers(original), *dlq_headers(info)]


def _int_header(found: dict[str, str], name: str) -> int:
    try:
        return int(found[name])
    except ValueError:
        raise DlqHeaderError(f"header {name} is not an integer") from None


def parse_dlq_headers(headers: Iterable[tuple[str, bytes | None]]) -> DeadLetterInfo:
    """Read a `DeadLetterInfo` back from a DLQ record's headers (the last value wins for repeated names).

    Raises `DlqHeaderError` when a header is missing, not UTF-8 or not an integer where one is expected.
    An unknown reason code raises too: replay tooling filters on reasons, so it must understand them.
    """
    names = set(DLQ_HEADER_NAMES)
    found: dict[str, str] = {}
    for name, value in headers:
        if name in names and value is not None:
            try:
                found[name] = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                raise DlqHeaderError(f"header {name} is not UTF-8") from None
    missing = [name for name in DLQ_HEADER_NAMES if name not in found]
    if missing:
        raise DlqHeaderError(f"missing DLQ headers: {', '.join(missing)}")
    try:
        reason = DlqReason(found[H_REASON])
    except ValueError:
        raise DlqHeaderError(f"unknown DLQ reason {short_text(found[H_REASON], 64)!r}") from None
    return DeadLetterInfo(
        original_topic=found[H_ORIGINAL_TOPIC],
        original_partition=_int_header(found, H_ORIGINAL_PARTITION),
        original_offset=_int_header(found, H_ORIGINAL_OFFSET),
        reason=reason,
        stage=found[H_STAGE],
        attempts=_int_header(found, H_ATTEMPTS),
        exception_fqcn=found[H_EXCEPTION_FQCN],
        exception_message=found[H_EXCEPTION_MESSAGE],
    )
