"""Routed decision record, route summary and decision headers."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.envelope import DefaultSchema, to_request
from schemas.routing import (
    EngineInfo,
    RoutedDecision,
    RouteSummary,
    SourceRef,
    decision_headers,
    nearest_level,
    route_summary,
)
from schemas.systemone import SystemOneResponse, build_response, parse_request

WHEN = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def default_response(truncated: bool = False) -> SystemOneResponse:
    request = to_request(b'{"host": "db1", "msg": "replication lag"}', DefaultSchema())
    # department options in encoding order: application, database, facilities, network, security, storage
    probs = {
        "department": [0.05, 0.8, 0.05, 0.05, 0.03, 0.02],
        "urgency": [0.1, 0.2, 0.6, 0.1],
        "outage": [0.3, 0.7],
    }
    return build_response(request, probs, input_tokens=321, state_truncated=truncated)


def decision(response: SystemOneResponse, **kwargs: Any) -> RoutedDecision:
    return RoutedDecision.from_response(
        response,
        event_id="evt-1",
        source=SourceRef(topic="alerts.in", partition=3, offset=42),
        engine=EngineInfo(version="0.1.0", device="cuda:0"),
        decided_at=WHEN,
        **kwargs,
    )


def test_route_summary_from_default_schema() -> None:
    route = route_summary(default_response())
    assert route.department == "database"
    assert route.department_confidence == pytest.approx((0.8 - 1 / 6) / (1 - 1 / 6), abs=1e-4)
    assert route.urgency == pytest.approx(1.7)
    assert route.urgency_label == "high"
    assert route.outage is False
    assert route.outage_probability == 0.3


def test_route_summary_missing_or_mistyped_questions_are_null() -> None:
    request = parse_request(
        {
            "state": "s",
            "questions": {"department": {"type": "noul"}, "other": {"type": "score", "criteria": ["a", "b"]}},
        }
    )
    response = build_response(request, {"department": [1, 0], "other": [0, 1]}, input_tokens=1)
    assert route_summary(response) == RouteSummary()
    custom = route_summary(response, outage_id="department", urgency_id="other")
    assert (custom.outage, custom.outage_probability) == (True, 1.0)
    assert (custom.urgency, custom.urgency_label, custom.department) == (1.0, "b", None)


@pytest.mark.parametrize(
    ("level", "label"),
    [("sev", "sev"), ({"b": 1, "a": "é"}, '{"a":"é","b":1}'), (["x", 2], '["x",2]'), (None, "1"), ("", "1")],
)
def test_urgency_label_from_legend_values(level: object, label: str) -> None:
    # The legend keeps the request's values as given; the routing label is always text.
    question = {"type": "score", "criteria": ["lo", level]}
    request = parse_request({"state": "s", "questions": {"urgency": question}})
    response = build_response(request, {"urgency": [0, 1]}, input_tokens=1)
    answered = "" if level is None else level  # SPEC 2: a null level is answered ""
    assert response.answers["urgency"].legend["1"] == answered  # type: ignore[union-attr]
    assert route_summary(response).urgency_label == label


@pytest.mark.parametrize(("score", "level"), [(0.0, 0), (0.49, 0), (0.5, 1), (2.5, 3), (3.0, 3), (9.0, 3)])
def test_nearest_level(score: float, level: int) -> None:
    assert nearest_level(score, 4) == level


def test_decision_json_round_trip_and_shape() -> None:
    record = decision(default_response())
    raw = record.to_json()
    data = json.loads(raw)
    assert list(data) == ["event_id", "source", "model", "answers", "route", "usage", "decided_at", "engine"]
    assert data["source"] == {"topic": "alerts.in", "partition": 3, "offset": 42}
    assert list(data["route"]) == [
        "department", "department_confidence", "urgency", "urgency_label", "outage", "outage_probability"
    ]  # fmt: skip
    assert data["usage"] == {"input_tokens": 321, "output_tokens": 0}
    assert data["decided_at"].startswith("2026-01-02T03:04:05.678")
    assert data["engine"] == {"name": "clef-router", "version": "0.1.0", "device": "cuda:0"}
    again = RoutedDecision.from_json(raw)
    assert again == record
    assert again.to_json() == raw


def test_decision_carries_truncation_extra() -> None:
    data = json.loads(decision(default_response(truncated=True)).to_json())
    assert data["x_state_truncated"] is True


def test_decided_at_defaults_to_aware_now_and_must_be_aware() -> None:
    record = RoutedDecision.from_response(
        default_response(),
        event_id="e",
        source=SourceRef(topic="t", partition=0, offset=0),
        engine=EngineInfo(),
    )
    assert record.decided_at.tzinfo is not None
    assert abs(datetime.now(UTC) - record.decided_at) < timedelta(minutes=1)
    data = json.loads(record.to_json())
    data["decided_at"] = "2026-01-02T03:04:05"
    with pytest.raises(ValidationError):
        RoutedDecision.from_json(json.dumps(data))
    data["decided_at"] = datetime(2026, 1, 2, tzinfo=timezone(timedelta(hours=2))).isoformat()
    assert RoutedDecision.from_json(json.dumps(data)).decided_at.utcoffset() == timedelta(hours=2)


@pytest.mark.parametrize("bad", [b"{}", b"not json", b'{"event_id": 1}'])
def test_from_json_refuses_garbage(bad: bytes) -> None:
    with pytest.raises(ValidationError):
        RoutedDecision.from_json(bad)


def test_source_ref_refuses_negative() -> None:
    with pytest.raises(ValidationError):
        SourceRef(topic="t", partition=-1, offset=0)


def test_decision_headers() -> None:
    route = route_summary(default_response())
    assert decision_headers(route) == [
        ("clef-department", b"database"),
        ("clef-urgency", b"high"),
        ("clef-outage", b"false"),
    ]
    assert decision_headers(RouteSummary()) == []
    unicode_route = RouteSummary(department="réseau", urgency_label="緊急", outage=True)
    assert decision_headers(unicode_route) == [
        ("clef-department", "réseau".encode()),
        ("clef-urgency", "緊急".encode()),
        ("clef-outage", b"true"),
    ]
