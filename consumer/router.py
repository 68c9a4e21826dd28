"""Routing: one answered event -> its output records (pure, no I/O).

Every answered event yields exactly two records with the same value, key and headers: one on the decisions
topic and one on exactly one `route.*` topic: `route.review` when the routing choice's confidence is below
the threshold, else `route_prefix + department_map[choice]`, else (no routing answer, or an unmapped
choice) `route.unrouted`. The input key and CloudEvents `ce_*` headers are kept; `clef-department`,
`clef-urgency` and `clef-outage` headers are added.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from consumer.settings import RoutingSettings, TopicSettings
from schemas.routing import (
    EngineInfo,
    RoutedDecision,
    RouteSummary,
    SourceRef,
    decision_headers,
    route_summary,
)
from schemas.systemone import SystemOneResponse

Header = tuple[str, bytes]
CE_PREFIX = "ce_"


@dataclass(frozen=True, slots=True)
class InputRecord:
    """What the pipeline keeps of a consumed record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class OutRecord:
    """One record to publish."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def passthrough_headers(headers: tuple[tuple[str, bytes | None], ...]) -> list[tuple[str, bytes | None]]:
    """The CloudEvents `ce_*` headers of an input record, in order."""
    return [(name, value) for name, value in headers if name.startswith(CE_PREFIX)]


def route_topic(route: RouteSummary, routing: RoutingSettings, topics: TopicSettings) -> str:
    """The single `route.*` topic for a decision (see the module docstring)."""
    if route.department is None:
        return topics.unrouted
    if route.department_confidence is not None and route.department_confidence < routing.review_threshold:
        return topics.review
    suffix = routing.department_map.get(route.department)
    return topics.unrouted if suffix is None else topics.route_prefix + suffix


def route_outputs(
    record: InputRecord,
    response: SystemOneResponse,
    *,
    event_id: str | None,
    routing: RoutingSettings,
    topics: TopicSettings,
    engine: EngineInfo,
    decided_at: datetime | None = None,
) -> list[OutRecord]:
    """The decisions record and the route record for one answered event (pure)."""
    # Same record as `RoutedDecision.from_response`, built without re-validating the engine's (already
    # validated) answers: this runs once per event on the event loop.
    route = route_summary(
        response,
        department_id=routing.question,
        urgency_id=routing.urgency_question,
        outage_id=routing.outage_question,
        outage_threshold=routing.outage_threshold,
    )
    decision = RoutedDecision.model_construct(
        event_id=event_id or f"{record.topic}:{record.partition}:{record.offset}",
        source=SourceRef.model_construct(
            topic=record.topic, partition=record.partition, offset=record.offset
        ),
        model=response.model,
        answers=response.answers,
        route=route,
        usage=response.usage,
        decided_at=decided_at if decided_at is not None else datetime.now(UTC),
        engine=engine,
        x_state_truncated=response.x_state_truncated,
        x_extra=None,
    )
    value = decision.to_json()
    headers: tuple[tuple[str, bytes | None], ...] = (
        *passthrough_headers(record.headers),
        *decision_headers(decision.route),
    )
    return [
        OutRecord(topics.decisions, record.key, value, headers),
        OutRecord(route_topic(decision.route, routing, topics), record.key, value, headers),
    ]
