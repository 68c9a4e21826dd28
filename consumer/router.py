"""Routing: one answered event -> its output records (pure, no I/O).

Every answered event yields exactly two records with the same value, key and headers: one on the decisions
topic and one on exactly one `route.*` topic: `route.review` when the routing choice's confidence is below
the threshold, else `route_prefix + department_map[choice]`, else (no routing answer, or an unmapped
choice) `route.unrouted`. The input key and CloudEvents `ce_*` headers are kept; `clef-department`,
`clef-urgency` and `clef-outage` headers are added.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import NamedTuple

from consumer.settings import RoutingSettings, TopicSettings
from schemas.routing import (
    EngineInfo,
    RouteSummary,
    decision_headers,
    decision_json,
    engine_json,
    route_fields,
)
from schemas.systemone import SystemOneResponse

Header = tuple[str, bytes]
CE_PREFIX = "ce_"


class InputRecord(NamedTuple):
    """What the pipeline keeps of a consumed record (a named tuple: immutable and cheap to build)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int | None = None


class OutRecord(NamedTuple):
    """One record to publish (a named tuple: immutable and cheap to build)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def passthrough_headers(headers: tuple[tuple[str, bytes | None], ...]) -> list[tuple[str, bytes | None]]:
    """The CloudEvents `ce_*` headers of an input record, in order."""
    return [(name, value) for name, value in headers if name.startswith(CE_PREFIX)]


def route_topic(route: RouteSummary, routing: RoutingSettings, topics: TopicSettings) -> str:
    """The single `route.*` topic for a decision (see the module docstring)."""
    return _route_topic(route.department, route.department_confidence, routing, topics)


def _route_topic(
    department: object, confidence: object, routing: RoutingSettings, topics: TopicSettings
) -> str:
    if not isinstance(department, str):
        return topics.unrouted
    if isinstance(confidence, float | int) and confidence < routing.review_threshold:
        return topics.review
    suffix = routing.department_map.get(department)
    return topics.unrouted if suffix is None else topics.route_prefix + suffix


def route_outputs(
    record: InputRecord,
    response: SystemOneResponse,
    *,
    event_id: str | None,
    routing: RoutingSettings,
    topics: TopicSettings,
    engine: EngineInfo | bytes,
    decided_at: datetime | None = None,
) -> list[OutRecord]:
    """The decisions record and the route record for one answered event (pure).

    `engine` is the `EngineInfo` or, on the hot path, its `engine_json` bytes computed once. The value is
    `RoutedDecision.to_json()` of the decision (same bytes), written by `decision_json` without building
    models: this runs once per event on the event loop.
    """
    route = route_fields(
        response,
        department_id=routing.question,
        urgency_id=routing.urgency_question,
        outage_id=routing.outage_question,
        outage_threshold=routing.outage_threshold,
    )
    value = decision_json(
        response,
        event_id=event_id or f"{record.topic}:{record.partition}:{record.offset}",
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        route=route,
        decided_at=decided_at if decided_at is not None else datetime.now(UTC),
        engine=engine if isinstance(engine, bytes) else engine_json(engine),
    )
    headers: tuple[tuple[str, bytes | None], ...] = (
        *passthrough_headers(record.headers),
        *decision_headers(route),
    )
    topic = _route_topic(route["department"], route["department_confidence"], routing, topics)
    return [
        OutRecord(topics.decisions, record.key, value, headers),
        OutRecord(topic, record.key, value, headers),
    ]
