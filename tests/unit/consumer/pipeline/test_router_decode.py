"""Router (pure) and decode (value -> request, reason codes)."""

from __future__ import annotations

import json

import pytest

from consumer.pipeline.decode import decode_value, header_event_id
from consumer.pipeline.router import route_outputs, route_topic
from consumer.records import InputRecord
from consumer.settings import RoutingSettings, TopicSettings
from schemas.dead_letter import stage_for
from schemas.envelope import DefaultSchema, to_request
from schemas.errors import DlqReason, RequestError
from schemas.parse import RequestLimits
from schemas.routing import EngineInfo, RoutedDecision, RouteSummary
from schemas.systemone import SystemOneRequest, SystemOneResponse, build_response, parse_request

TOPICS = TopicSettings()
ROUTING = RoutingSettings()
SCHEMA = DefaultSchema()
LIMITS = RequestLimits(max_value_bytes=4096)


def _response(dept_top: str, peak: float) -> tuple[SystemOneRequest, SystemOneResponse]:
    request = to_request({"summary": "disk full"}, SCHEMA)
    depts = sorted(SCHEMA.departments)  # option_table order for choice
    n = len(depts)
    dept = [peak if d == dept_top else (1 - peak) / (n - 1) for d in depts]
    return request, build_response(
        request, {"department": dept, "urgency": [0.1, 0.1, 0.7, 0.1], "outage": [0.9, 0.1]}, input_tokens=50
    )


def test_route_topic_rules() -> None:
    assert (
        route_topic(RouteSummary(department="network", department_confidence=0.9), ROUTING, TOPICS)
        == "route.network"
    )
    assert (
        route_topic(RouteSummary(department="network", department_confidence=0.1), ROUTING, TOPICS)
        == "route.review"
    )
    assert (
        route_topic(RouteSummary(department="marketing", department_confidence=0.9), ROUTING, TOPICS)
        == "route.unrouted"
    )
    assert route_topic(RouteSummary(), ROUTING, TOPICS) == "route.unrouted"
    custom = RoutingSettings(department_map={"network": "netops"})
    assert (
        route_topic(RouteSummary(department="network", department_confidence=0.9), custom, TOPICS)
        == "route.netops"
    )


def test_route_outputs_decision_and_route_with_headers() -> None:
    _, response = _response("storage", 0.95)
    record = InputRecord("alerts.in", 1, 7, b"host-9", b"{}", (("ce_id", b"e-9"), ("traceparent", b"x")), 0)
    outs = route_outputs(
        record,
        response,
        event_id="e-9",
        routing=ROUTING,
        topics=TOPICS,
        engine=EngineInfo(version="t"),
    )
    assert [o.topic for o in outs] == ["decisions", "route.storage"]
    assert all(o.key == b"host-9" for o in outs)
    headers = dict(outs[0].headers)
    assert headers["ce_id"] == b"e-9"
    assert "traceparent" not in headers
    assert headers["clef-department"] == b"storage"
    assert headers["clef-urgency"] == b"high"
    assert headers["clef-outage"] == b"true"
    decision = RoutedDecision.from_json(outs[0].value or b"")
    assert decision.event_id == "e-9"
    assert decision.source.offset == 7
    assert decision.source.partition == 1
    assert decision.route.department == "storage"
    assert decision.route.urgency_label == "high"
    assert outs[0].value == outs[1].value


def test_low_confidence_goes_to_review() -> None:
    _, response = _response("network", 0.3)
    record = InputRecord("alerts.in", 0, 1, None, b"{}", (), None)
    outs = route_outputs(
        record,
        response,
        event_id=None,
        routing=ROUTING,
        topics=TOPICS,
        engine=EngineInfo(),
    )
    assert [o.topic for o in outs] == ["decisions", "route.review"]
    assert json.loads(outs[0].value or b"")["event_id"] == "alerts.in:0:1"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, DlqReason.empty_value),
        (b"", DlqReason.empty_value),
        (b'{"a": ', DlqReason.bad_json),
        (b"[1, 2]", DlqReason.not_an_object),
        (b'"text"', DlqReason.not_an_object),
        (b'{"state": "x", "questions": {}}', DlqReason.schema_violation),
        (b'{"state": null, "questions": {"q": {"type": "noul"}}}', DlqReason.schema_violation),
        (b'{"x": "' + b"a" * 5000 + b'"}', DlqReason.value_too_large),
        (b'{"summary": "x", "images": "not-a-list"}', DlqReason.schema_violation),
    ],
)
def test_decode_reasons(value: bytes | None, reason: DlqReason) -> None:
    with pytest.raises(RequestError) as info:
        decode_value(value, SCHEMA, LIMITS)
    assert info.value.reason == reason


def test_event_fast_path_equals_the_envelope() -> None:
    raw = b'{"event_id": "e1", "summary": "BGP down", "n": 3, "nested": {"a": [1, 2.5, null]}}'
    decoded = decode_value(raw, SCHEMA, LIMITS)
    assert decoded.event_id == "e1"
    assert decoded.request == to_request(raw, SCHEMA)
    again = decode_value(b'{"summary": "other"}', SCHEMA, LIMITS)
    assert again.request.state == {"summary": "other"}  # each event gets its own state
    assert decoded.request.state["summary"] == "BGP down"
    custom = DefaultSchema(model="other-model")
    assert decode_value(raw, custom, LIMITS).request == to_request(raw, custom)  # one template per schema


def test_systemone_body_is_validated() -> None:
    raw = b'{"model": "m", "state": "s", "questions": {"q": {"type": "noul"}}}'
    decoded = decode_value(raw, SCHEMA, LIMITS)
    assert decoded.request == parse_request(raw)
    assert decoded.event_id is None


def test_header_event_id_and_stage() -> None:
    assert header_event_id([("ce_id", b"abc")]) == "abc"
    assert header_event_id([("other", b"abc")]) is None
    assert stage_for(DlqReason.bad_json) == "decode"
    assert stage_for(DlqReason.media_bomb) == "media"
    assert stage_for(DlqReason.context_length_exceeded) == "tokenize"
    assert stage_for(DlqReason.oom_single_record) == "engine"
