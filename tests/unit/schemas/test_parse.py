"""Parsing: size limit before JSON, bad JSON, non-objects, 422 bodies that never echo input."""

from __future__ import annotations

import json
from collections import OrderedDict

import pytest

from schemas.errors import MAX_ERROR_ITEMS, RequestError, sanitize_errors, short_text, status_for
from schemas.systemone import DlqReason, RequestLimits, SystemOneRequest, check_value_size, parse_request

GOOD = {"state": "s", "questions": {"q": {"type": "noul"}}}


def reason_of(value: object, limits: RequestLimits | None = None) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_request(value, limits) if limits else parse_request(value)  # type: ignore[arg-type]
    return info.value


def test_accepts_bytes_str_bytearray_memoryview_mapping_and_model() -> None:
    raw = json.dumps(GOOD)
    expected = parse_request(raw)
    assert parse_request(raw.encode()) == expected
    assert parse_request(bytearray(raw.encode())) == expected
    assert parse_request(memoryview(raw.encode())) == expected
    assert parse_request(OrderedDict(GOOD)) == expected
    assert parse_request(expected) is expected


def test_value_too_large_checked_before_json() -> None:
    limits = RequestLimits(max_value_bytes=16)
    error = reason_of(b"{" * 17, limits)  # invalid JSON, but the size wins
    assert (error.reason, error.status) == (DlqReason.value_too_large, 400)
    assert reason_of(b"{" * 16, limits).reason is DlqReason.bad_json


def test_value_size_counts_utf8_bytes_for_text() -> None:
    limits = RequestLimits(max_value_bytes=8)
    check_value_size("é" * 4, limits)  # 8 bytes
    with pytest.raises(RequestError):
        check_value_size("é" * 5, limits)  # 10 bytes, 5 characters
    with pytest.raises(RequestError):
        check_value_size(b"x" * 9, limits)


def test_default_limit_is_32_mib() -> None:
    assert RequestLimits().max_value_bytes == 32 * 1024 * 1024
    with pytest.raises(ValueError, match="positive"):
        RequestLimits(max_value_bytes=0)


@pytest.mark.parametrize(
    "raw",
    [b"{", b"nope", b'{"state": "x",}', b"\xff\xfe\x00", b'{"state": "\\ud800"}', b"[" * 5000, b"{'a': 1}"],
)
def test_bad_json(raw: bytes) -> None:
    error = reason_of(raw)
    assert (error.reason, error.status) == (DlqReason.bad_json, 400)
    assert error.body() == {"detail": {"error_type": "bad_json", "message": error.message}}


@pytest.mark.parametrize("raw", [b"[]", b"[1, 2]", b'"text"', b"3", b"null", b"true"])
def test_not_an_object(raw: bytes) -> None:
    error = reason_of(raw)
    assert (error.reason, error.status) == (DlqReason.not_an_object, 400)


@pytest.mark.parametrize("value", [[1], "x", 3, object()])
def test_python_non_mapping_is_not_an_object(value: object) -> None:
    if isinstance(value, str):
        assert reason_of(value).reason is DlqReason.bad_json
    else:
        assert reason_of(value).reason is DlqReason.not_an_object


@pytest.mark.parametrize("value", [None, b"", ""])
def test_empty_value(value: object) -> None:
    assert reason_of(value).reason is DlqReason.empty_value


def test_schema_violation_body_has_type_loc_msg_only() -> None:
    error = reason_of(
        json.dumps({"state": None, "questions": {"q": {"type": "score", "criteria": {"0": "a"}}}})
    )
    assert (error.reason, error.status) == (DlqReason.schema_violation, 422)
    detail = error.body()["detail"]
    assert isinstance(detail, list)
    assert detail
    for item in detail:
        assert set(item) == {"type", "loc", "msg"}
    assert {tuple(item["loc"]) for item in detail} >= {("state",), ("questions", "q", "score", "criteria")}


def test_large_inputs_never_echoed() -> None:
    secret = "S3CRET" * 20_000
    values = [
        {"state": secret, "questions": {secret: {"type": "noul"}}},  # bad id, huge
        {"state": secret, "questions": {"q": {"type": secret}}},  # bad tag, huge
        {"state": 7, "questions": {"q": {"type": "choice", "criteria": {secret: secret}}}},
        {"state": secret, "questions": {"q": {"type": "noul"}}, "images": [1] * 3 + [secret]},
    ]
    for value in values:
        error = reason_of(json.dumps(value).encode())
        text = json.dumps(error.body()) + error.message + repr(error)
        assert "S3CRET" * 20 not in text
        assert len(text) < 10_000


def test_error_list_is_capped() -> None:
    questions = {f"q{i}": {"type": "bad"} for i in range(64)}
    error = reason_of(json.dumps({"state": "s", "questions": questions}))
    assert error.errors is not None
    assert len(error.errors) == MAX_ERROR_ITEMS


def test_sanitize_errors_drops_input_and_ctx() -> None:
    raw = [{"type": "t", "loc": ("a", 0, "x" * 500), "msg": "m" * 1000, "input": "big", "ctx": {"x": 1}}]
    (item,) = sanitize_errors(raw)
    assert set(item) == {"type", "loc", "msg"}
    assert item["loc"][:2] == ["a", 0]
    assert len(item["loc"][2]) <= 64
    assert len(item["msg"]) <= 200


def test_short_text() -> None:
    assert short_text("abc") == "abc"
    assert short_text("a\nb\x00c") == "a b c"
    assert len(short_text("x" * 1000)) == 200
    assert short_text("x" * 1000).endswith("…")


def test_status_mapping_and_constructor() -> None:
    assert status_for(DlqReason.schema_violation) == 422
    assert status_for(DlqReason.context_length_exceeded) == 400
    assert status_for(DlqReason.media_bomb) == 400
    assert status_for(DlqReason.engine_failed) == 500
    error = RequestError(DlqReason.context_length_exceeded, "prompt needs 70000 tokens, limit 64000")
    assert error.status == 400
    assert str(error) == error.message
    assert error.body() == {
        "detail": {
            "error_type": "context_length_exceeded",
            "message": "prompt needs 70000 tokens, limit 64000",
        }
    }
    assert RequestError(DlqReason.media_too_large, "x", status=413).status == 413


def test_reason_codes_are_stable_strings() -> None:
    expected = {
        "empty_value", "value_too_large", "bad_json", "not_an_object", "schema_violation",
        "context_length_exceeded", "media_bad_source", "media_forbidden_url", "media_forbidden_path",
        "media_fetch_failed", "media_too_large", "media_too_long", "media_bomb", "media_undecodable",
        "oom_single_record", "engine_failed",
    }  # fmt: skip
    assert {reason.value for reason in DlqReason} == expected
    assert all(str(reason) == reason.value for reason in DlqReason)


def test_unknown_top_level_fields_logged_at_debug() -> None:
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        request = parse_request(json.dumps({**GOOD, "trace": {"big": "x" * 100}, "zz": 1}))
    assert isinstance(request, SystemOneRequest)
    events = [entry for entry in logs if entry["event"] == "systemone_unknown_fields_ignored"]
    assert events
    assert events[0]["log_level"] == "debug"
    assert events[0]["fields"] == ["trace", "zz"]
    assert "x" * 100 not in repr(events)
