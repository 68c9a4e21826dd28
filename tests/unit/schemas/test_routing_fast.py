"""The model-free decision path (`route_fields`, `decision_json`) matches `RoutedDecision` byte for byte."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from schemas.envelope import DefaultSchema, to_request
from schemas.routing import (
    EngineInfo,
    RoutedDecision,
    RouteSummary,
    SourceRef,
    datetime_json,
    decision_headers,
    decision_json,
    engine_json,
    route_fields,
    route_summary,
)
from schemas.systemone import SystemOneResponse, build_response, parse_request

WHEN = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def _default(probs: dict[str, list[float]], truncated: bool = False) -> SystemOneResponse:
    request = to_request({"host": "db1", "msg": "réplication lag ✓"}, DefaultSchema())
    return build_response(request, probs, input_tokens=321, state_truncated=truncated)


def _custom() -> SystemOneResponse:
    """Routing ids of another type (department is a score) and a missing outage question."""
    request = parse_request(
        {
            "state": {"x": 1},
            "questions": {
                "department": {"type": "score", "criteria": ["none", None, "élevé"]},
                "urgency": {"type": "choice", "criteria": {"a": "first", "b": None}},
            },
        }
    )
    return build_response(request, {"department": [0.2, 0.3, 0.5], "urgency": [0.5, 0.5]}, input_tokens=7)


RESPONSES = {
    "typical": _default(
        {
            "department": [0.05, 0.8, 0.05, 0.05, 0.03, 0.02],
            "urgency": [0.1, 0.2, 0.6, 0.1],
            "outage": [0.3, 0.7],
        }
    ),
    "tiny_probabilities_truncated": _default(
        {
            "department": [1e-7, 0.99999, 1e-6, 3e-6, 2e-6, 4e-6],
            "urgency": [0.0, 0.0, 0.0, 1.0],
            "outage": [0.5, 0.5],
        },
        truncated=True,
    ),
    "low_confidence": _default(
        {"department": [0.17, 0.17, 0.16, 0.17, 0.16, 0.17], "urgency": [0.25] * 4, "outage": [1.0, 0.0]}
    ),
    "custom_questions": _custom(),
}
ENGINES = [
    EngineInfo(name="clef-router", version="0.1.0", model="clef-omni"),
    EngineInfo(version="", device="cuda:0", batch=32, dtype="bfloat16"),
]


@pytest.mark.parametrize("name", sorted(RESPONSES))
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("when", [WHEN, WHEN.astimezone(timezone(timedelta(hours=5, minutes=30)))])
def test_decision_json_is_byte_identical_to_the_model(name: str, engine: EngineInfo, when: datetime) -> None:
    response = RESPONSES[name]
    if name == "tiny_probabilities_truncated":
        response = response.model_copy(update={"x_state_truncated": False})  # false is written too
    model = RoutedDecision.from_response(
        response,
        event_id='évt-1 "quoted"',
        source=SourceRef(topic="alerts.in", partition=3, offset=42),
        engine=engine,
        decided_at=when,
        outage_threshold=0.6,
    )
    record = {
        "event_id": 'évt-1 "quoted"',
        "topic": "alerts.in",
        "partition": 3,
        "offset": 42,
        "route": route_fields(response, outage_threshold=0.6),
        "engine": engine_json(engine),
    }
    fast = decision_json(response, decided_at=when, **record)
    assert fast == model.to_json()
    assert RoutedDecision.from_json(fast) == model
    # `decided_at` encoded once for many records: the same bytes
    spliced = decision_json(response, decided_at=datetime_json(when), **record)
    assert spliced == fast


@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_route_fields_match_route_summary_and_headers(name: str) -> None:
    response = RESPONSES[name]
    for ids in ({}, {"department_id": "urgency", "urgency_id": "department", "outage_id": "nope"}):
        fields = route_fields(response, **ids)
        summary = route_summary(response, **ids)
        assert list(fields) == list(RouteSummary.model_fields)
        assert fields == summary.model_dump()
        assert decision_headers(fields) == decision_headers(summary)


def test_truncated_flag_is_kept() -> None:
    response = RESPONSES["tiny_probabilities_truncated"]
    assert response.x_state_truncated is True
    fast = decision_json(
        response,
        event_id="e",
        topic="t",
        partition=0,
        offset=0,
        route=route_fields(response),
        decided_at=WHEN,
        engine=engine_json(EngineInfo()),
    )
    model = RoutedDecision.from_response(
        response, event_id="e", source=SourceRef(topic="t", partition=0, offset=0), engine=EngineInfo(),
        decided_at=WHEN,
    )  # fmt: skip
    assert fast == model.to_json()
    assert fast.endswith(b',"x_state_truncated":true}')
