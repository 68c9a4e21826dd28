"""The pipeline benchmark's baseline loops produce what they claim: the service's own records (matched) or
the input twice (echo)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import NamedTuple

from bench.pipeline import echo_outputs, service_outputs
from consumer.pipeline.decode import decode_value
from consumer.pipeline.outputs import default_engine_info
from consumer.pipeline.router import Router
from consumer.records import InputRecord
from consumer.settings import load_settings
from devtools.stub import StubEngine, sample_event
from schemas.parse import RequestLimits
from schemas.routing import RoutedDecision, engine_json


class Rec(NamedTuple):
    """The fields of an aiokafka `ConsumerRecord` the loops read."""

    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


def test_matched_outputs_are_the_routers_records_for_each_event() -> None:
    settings = load_settings()
    outputs_for = service_outputs(settings, StubEngine(), 50)
    info = default_engine_info(settings.engine.model_name)
    router = Router(settings.routing, settings.topics, engine_json(info))
    limits = RequestLimits(max_value_bytes=settings.engine.max_message_bytes)
    route_topics = set()
    for i in range(50):
        value = sample_event(i)
        outs = outputs_for(Rec(value))
        decoded = decode_value(value, settings.routing.default_schema, limits)
        (response,) = StubEngine().execute([StubEngine().prepare(decoded.request)])
        expected = router.outputs(InputRecord("x", 0, i, None, value, ()), response, decoded.event_id, b"0")
        assert [(t, h) for t, _, h in outs] == [(o.topic, o.headers) for o in expected]
        assert outs[0][0] == settings.topics.decisions
        assert outs[1][0] == expected[1].topic
        assert outs[0][1] == outs[1][1]
        decision = RoutedDecision.from_json(outs[0][1] or b"")
        assert decision.event_id == f"ev-{i}"
        assert decision.answers == response.answers
        assert decision.decided_at <= datetime.now(UTC)
        route_topics.add(outs[1][0])
    assert len(route_topics) > 2  # the events spread over several route topics, as in the service run


def test_echo_outputs_forward_the_input_to_both_topics() -> None:
    rec = Rec(b'{"a": 1}', (("ce_id", b"1"),))
    assert echo_outputs(("a", "b"))(rec) == [("a", rec.value, rec.headers), ("b", rec.value, rec.headers)]
