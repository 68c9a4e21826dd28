"""DLQ headers: the SPEC section 7 set, built from exceptions and parsed back."""

from __future__ import annotations

import pytest

from schemas.dead_letter import (
    DLQ_HEADER_NAMES,
    DeadLetterInfo,
    DlqHeaderError,
    DlqStage,
    dlq_headers,
    exception_fqcn,
    parse_dlq_headers,
    strip_dlq_headers,
    with_dlq_headers,
)
from schemas.systemone import DlqReason, RequestError, parse_request

SPEC_HEADERS = {
    "kafka_dlt-original-topic",
    "kafka_dlt-original-partition",
    "kafka_dlt-original-offset",
    "kafka_dlt-exception-fqcn",
    "kafka_dlt-exception-message",
    "clef-dlq-reason",
    "clef-dlq-stage",
    "clef-dlq-attempts",
}


def request_error() -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_request(b'{"state": "SECRET-PAYLOAD", "questions": {}}')
    return info.value


def test_headers_from_request_error() -> None:
    info = DeadLetterInfo.from_exception(
        request_error(), topic="alerts.in", partition=2, offset=99, stage=DlqStage.decode
    )
    headers = dlq_headers(info)
    assert [name for name, _ in headers] == list(DLQ_HEADER_NAMES)
    assert set(DLQ_HEADER_NAMES) == SPEC_HEADERS
    values = dict(headers)
    assert all(isinstance(value, bytes) for value in values.values())
    assert values["kafka_dlt-original-topic"] == b"alerts.in"
    assert values["kafka_dlt-original-partition"] == b"2"
    assert values["kafka_dlt-original-offset"] == b"99"
    assert values["kafka_dlt-exception-fqcn"] == b"schemas.errors.RequestError"
    assert values["clef-dlq-reason"] == b"schema_violation"
    assert values["clef-dlq-stage"] == b"decode"
    assert values["clef-dlq-attempts"] == b"1"
    assert b"SECRET-PAYLOAD" not in b"".join(values.values())


def test_generic_exception_defaults_to_engine_failed_and_is_shortened() -> None:
    exc = RuntimeError("boom\n" + "x" * 5000)
    info = DeadLetterInfo.from_exception(exc, topic="t", partition=0, offset=1, stage="engine", attempts=3)
    assert info.reason is DlqReason.engine_failed
    assert info.exception_fqcn == "builtins.RuntimeError"
    assert len(info.exception_message) <= 200
    assert "\n" not in info.exception_message
    explicit = DeadLetterInfo.from_exception(
        exc, topic="t", partition=0, offset=1, stage="engine", reason=DlqReason.oom_single_record
    )
    assert explicit.reason is DlqReason.oom_single_record
    assert (
        DeadLetterInfo.from_exception(
            ValueError(), topic="t", partition=0, offset=0, stage="x"
        ).exception_message
        == "ValueError"
    )


def test_exception_fqcn_for_nested_class() -> None:
    class LocalError(Exception):
        pass

    assert exception_fqcn(LocalError()).endswith("test_exception_fqcn_for_nested_class.<locals>.LocalError")


def test_parse_round_trip() -> None:
    info = DeadLetterInfo(
        original_topic="alerts.é",
        original_partition=7,
        original_offset=123456789012,
        reason=DlqReason.media_bomb,
        stage="media",
        attempts=2,
        exception_fqcn="engine.media.MediaError",
        exception_message="image declares 40000x40000 pixels",
    )
    original = [("ce_id", b"abc"), ("trace", None)]
    headers = with_dlq_headers(original, info)
    assert headers[:2] == original
    assert parse_dlq_headers(headers) == info
    assert strip_dlq_headers(headers) == original


def test_redead_lettering_replaces_old_headers() -> None:
    first = DeadLetterInfo("t", 0, 1, DlqReason.bad_json, "decode", 1, "x.Y", "m")
    second = DeadLetterInfo("t", 0, 1, DlqReason.engine_failed, "engine", 2, "x.Z", "n")
    headers = with_dlq_headers(with_dlq_headers([("k", b"v")], first), second)
    assert len(headers) == 1 + len(DLQ_HEADER_NAMES)
    assert parse_dlq_headers(headers) == second


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("clef-dlq-reason", b"made_up", "unknown DLQ reason"),
        ("kafka_dlt-original-offset", b"12a", "not an integer"),
        ("kafka_dlt-original-topic", b"\xff", "not UTF-8"),
        ("clef-dlq-stage", None, "missing"),
    ],
)
def test_parse_refuses_bad_headers(name: str, value: bytes | None, match: str) -> None:
    info = DeadLetterInfo("t", 0, 1, DlqReason.bad_json, "decode", 1, "x.Y", "m")
    headers = [(n, value if n == name else v) for n, v in dlq_headers(info)]
    with pytest.raises(DlqHeaderError, match=match):
        parse_dlq_headers(headers)


def test_parse_refuses_plain_records() -> None:
    with pytest.raises(DlqHeaderError, match="missing"):
        parse_dlq_headers([("ce_id", b"1")])
