"""Event envelope: SystemOne bodies vs events, media lifted out, default schema."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from schemas.envelope import DEFAULT_DEPARTMENTS, DefaultSchema, event_to_request, to_request
from schemas.systemone import (
    ChoiceQuestion,
    DlqReason,
    NoulQuestion,
    RequestError,
    RequestLimits,
    ScoreQuestion,
    option_table,
    parse_request,
)

SCHEMA = DefaultSchema()


def test_default_schema_questions() -> None:
    questions = SCHEMA.questions
    assert list(questions) == ["department", "urgency", "outage"]
    department, urgency, outage = questions.values()
    assert isinstance(department, ChoiceQuestion)
    assert set(department.criteria) == {
        "network",
        "database",
        "storage",
        "security",
        "application",
        "facilities",
    }
    assert all(isinstance(text, str) and text for text in department.criteria.values())
    assert isinstance(urgency, ScoreQuestion)
    assert urgency.criteria == ["low", "medium", "high", "critical"]
    assert isinstance(outage, NoulQuestion)
    assert isinstance(outage.instructions, str)
    assert "outage" in outage.instructions
    assert [o.id for o in option_table(outage)] == ["true", "false"]


def test_event_becomes_state_with_media_lifted() -> None:
    event = {
        "host": "db1",
        "images": ["data:image/png;base64,AA"],
        "msg": "lag",
        "audio": [],
        "videos": ["v.mp4"],
    }
    request = to_request(json.dumps(event).encode(), SCHEMA)
    assert request.state == {"host": "db1", "msg": "lag"}
    assert list(request.state) == ["host", "msg"]
    assert request.images == ["data:image/png;base64,AA"]
    assert request.audio == []
    assert request.videos == ["v.mp4"]
    assert request.model == "clef-omni"
    assert list(request.questions) == ["department", "urgency", "outage"]


def test_empty_event_is_a_valid_state() -> None:
    assert to_request(b"{}", SCHEMA).state == {}


def test_systemone_body_is_used_as_is() -> None:
    body = {"state": ["x"], "questions": {"q": {"type": "noul"}}, "model": "m"}
    assert to_request(json.dumps(body), SCHEMA) == parse_request(body)
    assert to_request(body, SCHEMA) == parse_request(body)


def test_questions_key_means_systemone_even_when_invalid() -> None:
    with pytest.raises(RequestError) as info:
        to_request({"questions": None, "host": "x"}, SCHEMA)
    assert info.value.reason is DlqReason.schema_violation


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"[1,2]", DlqReason.not_an_object),
        (b'"text"', DlqReason.not_an_object),
        (b"12", DlqReason.not_an_object),
        (b"null", DlqReason.not_an_object),
        ([1], DlqReason.not_an_object),
        ("x", DlqReason.bad_json),
        (b"{bad", DlqReason.bad_json),
        (b"[" * 10_000, DlqReason.bad_json),
        (b"", DlqReason.empty_value),
        (None, DlqReason.empty_value),
        (b'{"images": "x"}', DlqReason.schema_violation),
        (b'{"images": [1]}', DlqReason.schema_violation),
        (b'{"videos": ["a", "b", "c"]}', DlqReason.schema_violation),
    ],
)
def test_refused_values(value: object, reason: DlqReason) -> None:
    with pytest.raises(RequestError) as info:
        to_request(value, SCHEMA)
    assert info.value.reason is reason
    assert 400 <= info.value.status < 500


def test_size_limit_applies_to_events() -> None:
    with pytest.raises(RequestError) as info:
        to_request(b'{"a": "' + b"x" * 100 + b'"}', SCHEMA, RequestLimits(max_value_bytes=50))
    assert info.value.reason is DlqReason.value_too_large


def test_custom_default_schema() -> None:
    schema = DefaultSchema.model_validate(
        {
            "model": "clef-omni-x",
            "department_id": "team",
            "departments": {"web": "web things", "dba": "databases"},
            "urgency_levels": ["p3", "p2", "p1"],
        }
    )
    request = event_to_request({"e": "é"}, schema)
    assert list(request.questions) == ["team", "urgency", "outage"]
    assert request.model == "clef-omni-x"
    urgency = request.questions["urgency"]
    assert isinstance(urgency, ScoreQuestion)
    assert urgency.criteria == ["p3", "p2", "p1"]


@pytest.mark.parametrize(
    "overrides",
    [
        {"department_id": "urgency"},
        {"department_id": ""},
        {"department_id": "x" * 1001},
        {"departments": {"only": "one"}},
        {"urgency_levels": ["one"]},
        {"unknown_setting": 1},
        {"departments": {"": "empty", "b": "x"}},
    ],
)
def test_default_schema_refuses(overrides: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        DefaultSchema.model_validate(overrides)


def test_default_departments_constant_is_not_shared() -> None:
    schema = DefaultSchema()
    assert schema.departments == DEFAULT_DEPARTMENTS
    assert schema.departments is not DEFAULT_DEPARTMENTS
