"""The routed decision record published for every answered event (SPEC section 7, "Output value").

`RoutedDecision` is the JSON value on `decisions` and `route.*`; `decision_headers` the `clef-*` headers
that go with it. `route_summary` reads the routing fields from a response; a custom SystemOne request
may lack any of the routing questions (or use another type for that id), and then those fields are null.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final, TypeGuard, TypeVar

import pydantic_core
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue

from schemas.request import render_value
from schemas.response import Answer, ChoiceAnswer, NoulAnswer, ScoreAnswer, SystemOneResponse, Usage

H_DEPARTMENT: Final = "clef-department"
H_URGENCY: Final = "clef-urgency"
H_OUTAGE: Final = "clef-outage"

_MAX_LABEL_CHARS: Final = 100
_A = TypeVar("_A")


class SourceRef(BaseModel):
    """Where the input record came from."""

    model_config = ConfigDict(frozen=True, json_schema_serialization_defaults_required=True)

    topic: str
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)


class RouteSummary(BaseModel):
    """The routing fields of one decision; each is null when its question is absent or of another type.

    `urgency` is the urgency score (expected level, 0..n-1); `urgency_label` the legend of the level
    nearest to it (half rounds up) as text (an object or array as compact JSON; null or "" as the level
    number), cut to 100 characters; `outage` is `outage_probability >= threshold`.
    """

    model_config = ConfigDict(frozen=True, json_schema_serialization_defaults_required=True)

    department: str | None = None
    department_confidence: float | None = None
    urgency: float | None = None
    urgency_label: str | None = None
    outage: bool | None = None
    outage_probability: float | None = None


def nearest_level(score: float, levels: int) -> int:
    """The level index nearest `score` (x.5 rounds up), clamped to 0..levels-1."""
    if not math.isfinite(score):
        return 0
    return min(max(math.floor(score + 0.5), 0), levels - 1)


def route_fields(
    response: SystemOneResponse,
    *,
    department_id: str = "department",
    urgency_id: str = "urgency",
    outage_id: str = "outage",
    outage_threshold: float = 0.5,
) -> dict[str, object]:
    """The `RouteSummary` fields of `response` as a plain dict: every field, in field order, null when its
    question is absent or of another type. The unvalidated fast path behind `route_summary` (the service
    calls it once per event); same values as `route_summary(...).model_dump()`."""
    answers = response.answers
    department = answers.get(department_id)
    urgency = answers.get(urgency_id)
    outage = answers.get(outage_id)
    choice: str | None = None
    confidence: float | None = None
    score: float | None = None
    label: str | None = None
    is_outage: bool | None = None
    probability: float | None = None
    if type(department) is ChoiceAnswer or _is(department, ChoiceAnswer):
        choice = department.choice
        confidence = float(department.confidence)
    if type(urgency) is ScoreAnswer or _is(urgency, ScoreAnswer):
        score = float(urgency.score)
        level = nearest_level(score, len(urgency.probabilities))
        label = _label(urgency.legend.get(str(level)), level)
    if type(outage) is NoulAnswer or _is(outage, NoulAnswer):
        probability = float(outage.noul)
        is_outage = outage.noul >= outage_threshold
    return {  # `RouteSummary` field order
        "department": choice,
        "department_confidence": confidence,
        "urgency": score,
        "urgency_label": label,
        "outage": is_outage,
        "outage_probability": probability,
    }


def _label(value: JsonValue, level: int) -> str:
    """A legend value as routing text: null and "" fall back to the level number."""
    if value is None or value == "":
        return str(level)
    return render_value(value)[:_MAX_LABEL_CHARS]


def _is(answer: object, kind: type[_A]) -> TypeGuard[_A]:
    # `isinstance` against a pydantic model class goes through ABCMeta (slow); callers test the exact type
    # first and come here only for a subclass, another answer type, or None
    return answer is not None and isinstance(answer, kind)


def route_summary(
    response: SystemOneResponse,
    *,
    department_id: str = "department",
    urgency_id: str = "urgency",
    outage_id: str = "outage",
    outage_threshold: float = 0.5,
) -> RouteSummary:
    """Extract the routing fields from `response` given the routing question ids. Pure; never raises
    for missing or differently-typed answers (those fields are null)."""
    fields = route_fields(
        response,
        department_id=department_id,
        urgency_id=urgency_id,
        outage_id=outage_id,
        outage_threshold=outage_threshold,
    )
    return RouteSummary.model_validate({k: v for k, v in fields.items() if v is not None})


class EngineInfo(BaseModel):
    """What produced the decision (free-form extras allowed, e.g. device, dtype, batch size)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    name: str = "clef-router"
    version: str = ""


class RoutedDecision(BaseModel):
    """The output value of one answered event. Serialise with `to_json`, read back with `from_json`."""

    model_config = ConfigDict(frozen=True, json_schema_serialization_defaults_required=True)

    event_id: str
    source: SourceRef
    model: str
    answers: dict[str, Answer]
    route: RouteSummary
    usage: Usage
    decided_at: AwareDatetime
    engine: EngineInfo
    x_state_truncated: bool | None = Field(default=None, exclude_if=lambda value: value is None)
    x_extra: dict[str, JsonValue] | None = Field(default=None, exclude_if=lambda value: value is None)

    @classmethod
    def from_response(
        cls,
        response: SystemOneResponse,
        *,
        event_id: str,
        source: SourceRef,
        engine: EngineInfo,
        decided_at: datetime | None = None,
        department_id: str = "department",
        urgency_id: str = "urgency",
        outage_id: str = "outage",
        outage_threshold: float = 0.5,
    ) -> RoutedDecision:
        """Build the record for `response`; `decided_at` defaults to now (UTC)."""
        return cls(
            event_id=event_id,
            source=source,
            model=response.model,
            answers=response.answers,
            route=route_summary(
                response,
                department_id=department_id,
                urgency_id=urgency_id,
                outage_id=outage_id,
                outage_threshold=outage_threshold,
            ),
            usage=response.usage,
            decided_at=decided_at if decided_at is not None else datetime.now(UTC),
            engine=engine,
            x_state_truncated=response.x_state_truncated,
        )

    def to_json(self) -> bytes:
        """UTF-8 JSON bytes (non-ASCII kept); `decided_at` as ISO 8601 with its UTC offset."""
        return self.model_dump_json().encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes | str) -> RoutedDecision:
        """Parse `to_json` output; raises `pydantic.ValidationError` on anything else."""
        return cls.model_validate_json(data)


def decision_headers(route: RouteSummary | Mapping[str, object]) -> list[tuple[str, bytes]]:
    """`clef-department` (choice), `clef-urgency` (urgency label), `clef-outage` ("true"/"false") as UTF-8
    bytes, in that order; a header whose field is null is left out. `route` is a `RouteSummary` or the
    dict of `route_fields`."""
    fields: Mapping[str, object] = route.__dict__ if isinstance(route, RouteSummary) else route
    department, label, outage = fields["department"], fields["urgency_label"], fields["outage"]
    headers: list[tuple[str, bytes]] = []
    if isinstance(department, str):
        headers.append((H_DEPARTMENT, department.encode("utf-8")))
    if isinstance(label, str):
        headers.append((H_URGENCY, label.encode("utf-8")))
    if isinstance(outage, bool):
        headers.append((H_OUTAGE, b"true" if outage else b"false"))
    return headers


def engine_json(engine: EngineInfo) -> bytes:
    """The `engine` member of a decision as JSON bytes (computed once per service, spliced by
    `decision_json`)."""
    return engine.model_dump_json().encode("utf-8")


def decision_json(
    response: SystemOneResponse,
    *,
    event_id: str,
    topic: str,
    partition: int,
    offset: int,
    route: Mapping[str, object],
    decided_at: datetime | bytes,
    engine: bytes,
) -> bytes:
    """The same bytes as `RoutedDecision.to_json()` for the decision on `response`, without building models.

    `route` is `route_fields(response, ...)`, `engine` is `engine_json(info)`, `decided_at` must be aware
    (or already encoded by `datetime_json`, e.g. once for many records decided together).
    The engine's answers and usage (already validated models) are serialised by their own pydantic
    serialisers through `pydantic_core.to_json`, so numbers, strings and dates are written exactly as the
    model writes them. No validation: the service's hot path (one call per answered event).
    """
    body = pydantic_core.to_json(
        {
            "event_id": event_id,
            "source": {"topic": topic, "partition": partition, "offset": offset},
            "model": response.model,
            "answers": response.answers,
            "route": route,
            "usage": response.usage,
        }
    )
    decided = decided_at if isinstance(decided_at, bytes) else datetime_json(decided_at)
    truncated = response.x_state_truncated
    if truncated is None:
        tail = b"}"
    else:
        tail = b',"x_state_truncated":true}' if truncated else b',"x_state_truncated":false}'
    return b"".join((body[:-1], b',"decided_at":', decided, b',"engine":', engine, tail))


def datetime_json(when: datetime) -> bytes:
    """`when` as `RoutedDecision` writes `decided_at` (a JSON string, ISO 8601 with its offset)."""
    return pydantic_core.to_json(when)
