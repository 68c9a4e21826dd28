"""Hypothesis fuzz of the Kafka decode path (issue 18): random bytes, random JSON and mutated valid events
(plain events and SystemOne bodies). Each record goes the way the pipeline takes it: `decode_value`, then
either the answer (stub engine) and the decision + route records, or a dead letter with a reason code.
Never anything else: no other exception, no record without an outcome.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer.pipeline.decode import decode_value, header_event_id
from consumer.pipeline.dlq import dead_letter
from consumer.pipeline.router import route_outputs
from consumer.records import InputRecord, OutRecord
from consumer.settings import RoutingSettings, TopicSettings
from devtools.stub import StubEngine, sample_event
from schemas.dead_letter import parse_dlq_headers, stage_for
from schemas.envelope import DefaultSchema
from schemas.errors import DlqReason, RequestError
from schemas.parse import RequestLimits
from schemas.routing import EngineInfo, RoutedDecision

SCHEMA = DefaultSchema()
LIMITS = RequestLimits(max_value_bytes=8192)
TOPICS = TopicSettings()
ROUTING = RoutingSettings()
ENGINE = StubEngine()
INFO = EngineInfo(name="fuzz", version="0")
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SYSTEMONE_BODY = {
    "model": "clef-omni",
    "state": {"host": "db-1", "summary": "replication lag 45s"},
    "questions": {
        "department": {"type": "choice", "criteria": {"network": "links", "database": None}},
        "urgency": {"type": "score", "criteria": ["low", "high"]},
        "outage": {"type": "noul"},
    },
}
VALID = [sample_event(i) for i in range(7)] + [json.dumps(SYSTEMONE_BODY).encode()]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=25,
)


def handle(value: bytes | None, headers: tuple[tuple[str, bytes | None], ...] = ()) -> list[OutRecord]:
    """One record through decode -> (answer + route) | dead letter, checking each outcome's shape."""
    record = InputRecord("alerts.in", 1, 42, b"key", value, headers)
    try:
        decoded = decode_value(value, SCHEMA, LIMITS)
    except RequestError as exc:
        return [_dead_letter(record, exc)]
    (response,) = ENGINE.execute([ENGINE.prepare(decoded.request)])
    event_id = decoded.event_id or header_event_id(headers)
    outs = route_outputs(record, response, event_id=event_id, routing=ROUTING, topics=TOPICS, engine=INFO)
    assert len(outs) == 2
    assert outs[0].topic == TOPICS.decisions
    assert outs[1].topic.startswith(TOPICS.route_prefix)
    decision = RoutedDecision.from_json(outs[0].value or b"")
    assert (decision.source.partition, decision.source.offset) == (1, 42)
    return outs


def _dead_letter(record: InputRecord, exc: RequestError) -> OutRecord:
    assert isinstance(exc.reason, DlqReason)
    out, _ = dead_letter(record, exc, topic=TOPICS.dlq, stage=stage_for(exc.reason), attempts=1)
    assert out.topic == TOPICS.dlq
    assert out.value == record.value  # the original bytes, for replay
    assert parse_dlq_headers(out.headers).reason == exc.reason
    return out


def test_the_valid_seeds_are_answered_and_a_cut_one_is_dead_lettered() -> None:
    for value in VALID:
        assert handle(value)[0].topic == TOPICS.decisions
    assert handle(VALID[-1][:-1])[0].topic == TOPICS.dlq


@FUZZ
@given(st.binary(max_size=600) | st.none())
def test_random_bytes(value: bytes | None) -> None:
    assert handle(value)


@FUZZ
@given(json_values)
def test_random_json_values(obj: Any) -> None:
    assert handle(json.dumps(obj).encode())


@st.composite
def mutated_bytes(draw: st.DrawFn) -> bytes:
    """A valid event with a few byte-level edits: flips, deletions, insertions, a cut."""
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "delete", "insert", "cut"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "delete" and data:
            del data[at : at + draw(st.integers(1, 8))]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[at:]
    return bytes(data)


@FUZZ
@given(mutated_bytes(), st.binary(max_size=20))
def test_mutated_valid_events(value: bytes, ce_id: bytes) -> None:
    assert handle(value, (("ce_id", ce_id),))


@st.composite
def mutated_json(draw: st.DrawFn) -> bytes:
    """A valid event or SystemOne body with some members replaced by (or added as) random JSON."""
    obj: dict[str, Any] = json.loads(draw(st.sampled_from(VALID)))
    keys = [*obj, "questions", "state", "images", "audio", "videos", "event_id", "model"]
    for key in draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True)):
        if draw(st.booleans()) and key in obj:
            del obj[key]
        else:
            obj[key] = draw(json_values)
    if isinstance(obj.get("questions"), dict) and draw(st.booleans()):
        obj["questions"][draw(st.text(max_size=10))] = draw(json_values)
    return json.dumps(obj).encode()


@FUZZ
@given(mutated_json())
def test_mutated_json_members(value: bytes) -> None:
    assert handle(value)
