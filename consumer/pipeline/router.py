"""Routing: one answered event -> its output records (pure, no I/O).

Every answered event yields exactly two records with the same value, key and headers: one on the decisions
topic and one on exactly one `route.*` topic: `route.review` when the routing choice's confidence is below
the threshold, else `route_prefix + department_map[choice]`, else (no routing answer, or an unmapped
choice) `route.unrouted`. The input key and CloudEvents `ce_*` headers are kept; `clef-department`,
`clef-urgency` and `clef-outage` headers are added.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from consumer.records import Headers, InputRecord, OutRecord
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

CE_PREFIX = "ce_"


def passthrough_headers(headers: Headers) -> list[tuple[str, bytes | None]]:
    """The CloudEvents `ce_*` headers of an input record, in order."""
    return [(name, value) for name, value in headers if name.startswith(CE_PREFIX)]


def route_topic(route: RouteSummary, routing: RoutingSettings, topics: TopicSettings) -> str:
    """The single `route.*` topic for a decision (see the module docstring)."""
    return Router(routing, topics, b"").topic(route.model_dump())


def route_outputs(
    record: InputRecord,
    response: SystemOneResponse,
    *,
    event_id: str | None,
    routing: RoutingSettings,
    topics: TopicSettings,
    engine: EngineInfo | bytes,
    decided_at: datetime | bytes | None = None,
) -> list[OutRecord]:
    """The decisions record and the route record for one answered event (pure).

    `engine` is the `EngineInfo` or its `engine_json` bytes; `decided_at` may be `datetime_json` bytes shared
    by records decided together (default: now). The value is `RoutedDecision.to_json()` of the decision
    (same bytes). The service builds a `Router` once instead of calling this per event.
    """
    info = engine if isinstance(engine, bytes) else engine_json(engine)
    when = decided_at if decided_at is not None else datetime.now(UTC)
    return Router(routing, topics, info).outputs(record, response, event_id, when)


class Router:
    """`route_outputs` with the settings read once: the emitter's per-event call (pure, no I/O)."""

    def __init__(self, routing: RoutingSettings, topics: TopicSettings, engine: bytes) -> None:
        self._routing = routing
        self._engine = engine
        self._decisions = topics.decisions
        self._review = topics.review
        self._unrouted = topics.unrouted
        self._review_below = routing.review_threshold
        self._by_choice = {
            choice: topics.route_prefix + suffix for choice, suffix in routing.department_map.items()
        }

    def topic(self, route: Mapping[str, object]) -> str:
        """The single `route.*` topic for the `route_fields` of a decision (see the module docstring)."""
        department, confidence = route["department"], route["department_confidence"]
        if not isinstance(department, str):
            return self._unrouted
        if isinstance(confidence, float | int) and confidence < self._review_below:
            return self._review
        return self._by_choice.get(department, self._unrouted)

    def outputs(
        self,
        record: InputRecord,
        response: SystemOneResponse,
        event_id: str | None,
        decided_at: datetime | bytes,
    ) -> list[OutRecord]:
        """The decisions record and the route record for one answered event (see `route_outputs`).

        The value is written by `decision_json` without building models: this runs once per event on the
        event loop.
        """
        r = self._routing
        route = route_fields(
            response,
            department_id=r.question,
            urgency_id=r.urgency_question,
            outage_id=r.outage_question,
            outage_threshold=r.outage_threshold,
        )
        value = decision_json(
            response,
            event_id=event_id or f"{record.topic}:{record.partition}:{record.offset}",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            route=route,
            decided_at=decided_at,
            engine=self._engine,
        )
        added = decision_headers(route)
        headers: Headers = (*passthrough_headers(record.headers), *added) if record.headers else tuple(added)
        key = record.key
        return [
            OutRecord(self._decisions, key, value, headers),
            OutRecord(self.topic(route), key, value, headers),
        ]
