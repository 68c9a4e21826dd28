"""Kafka record values -> SystemOne requests (SPEC section 7, "Input value").

A JSON object with a `questions` key is a SystemOne request body. Any other JSON object is an *event*:
the whole object (minus `images`/`audio`/`videos`, which become the request's media) is the state, and
the configured `DefaultSchema` supplies the questions: `department` (choice), `urgency` (score),
`outage` (noul).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any, Final

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.errors import DlqReason, RequestError
from schemas.parse import (
    DEFAULT_LIMITS,
    RequestLimits,
    check_value_size,
    error_from_validation,
    parse_request,
)
from schemas.request import (
    ChoiceQuestion,
    NoulCriteria,
    NoulQuestion,
    QuestionId,
    ScoreQuestion,
    SystemOneRequest,
)

MEDIA_KEYS: Final = ("images", "audio", "videos")

DEFAULT_DEPARTMENTS: Final[dict[str, str]] = {
    "network": "Connectivity, routing, DNS, load balancers, firewalls, VPNs, packet loss and latency.",
    "database": "Database servers, replication, slow queries, connection pools, locks and schema changes.",
    "storage": "Disks, volumes, object storage, backups, filesystems and capacity exhaustion.",
    "security": "Intrusions, malware, suspicious logins, bad certificates, leaked secrets, policy breaches.",
    "application": "Service errors, crashes, failed deploys, exceptions, queues and application performance.",
    "facilities": "Power, cooling, racks, physical access, hardware replacement and data-centre environment.",
}
DEFAULT_URGENCY_LEVELS: Final = ("low", "medium", "high", "critical")


class DefaultSchema(BaseModel):
    """The questions applied to plain events (configurable through settings; frozen once read).

    The routing question (`department_id`) is a choice over `departments` (option id -> one-line
    description); `urgency_id` a score over `urgency_levels` (lowest first; the level names are the
    legend and `urgency_label`); `outage_id` a noul question.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "clef-omni"
    department_id: QuestionId = "department"
    department_instructions: str = (
        "Which team must handle this alert or fault event? "
        "Pick the department that owns the failing component."
    )
    departments: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_DEPARTMENTS), min_length=2, max_length=255
    )
    urgency_id: QuestionId = "urgency"
    urgency_instructions: str = (
        "How urgently must a human act? low: can wait for working hours; medium: act today; "
        "high: act within the hour, users are affected; "
        "critical: act now, a major service is down or data is at risk."
    )
    urgency_levels: tuple[str, ...] = Field(default=DEFAULT_URGENCY_LEVELS, min_length=2, max_length=10)
    outage_id: QuestionId = "outage"
    outage_instructions: str = (
        "Does this event report a service outage, i.e. a service that is unavailable or failing "
        "for its users "
        "right now (not merely degraded, at risk or under maintenance)?"
    )

    @model_validator(mode="after")
    def _distinct_ids(self) -> DefaultSchema:
        if len({self.department_id, self.urgency_id, self.outage_id}) != 3:
            raise ValueError("department_id, urgency_id and outage_id must differ")
        if any(not key or len(key) > 100 for key in self.departments):
            raise ValueError("department ids must be 1..100 characters")
        return self

    @cached_property
    def questions(self) -> dict[str, NoulQuestion | ChoiceQuestion | ScoreQuestion]:
        """The three questions, in the order department, urgency, outage (built once)."""
        return {
            self.department_id: ChoiceQuestion(
                instructions=self.department_instructions, criteria=dict(self.departments)
            ),
            self.urgency_id: ScoreQuestion(
                instructions=self.urgency_instructions, criteria=list(self.urgency_levels)
            ),
            self.outage_id: NoulQuestion(instructions=self.outage_instructions, criteria=NoulCriteria()),
        }


def _decode_json(value: bytes | bytearray | memoryview | str, limits: RequestLimits) -> object:
    check_value_size(value, limits)
    data = bytes(value) if isinstance(value, memoryview) else value
    if len(data) == 0:
        raise RequestError(DlqReason.empty_value, "value is empty")
    try:
        return pydantic_core.from_json(data)
    except ValueError as exc:
        raise RequestError(DlqReason.bad_json, f"Invalid JSON: {str(exc)[:120]}") from None


def event_to_request(event: Mapping[str, Any], default_schema: DefaultSchema) -> SystemOneRequest:
    """The default-schema request for a plain event object (media keys lifted out, order kept).

    Raises `RequestError(schema_violation)` when a lifted media entry is not a valid media list.
    """
    state = {key: item for key, item in event.items() if key not in MEDIA_KEYS}
    body: dict[str, Any] = {
        "model": default_schema.model,
        "state": state,
        "questions": default_schema.questions,
    }
    for key in MEDIA_KEYS:
        if key in event:
            body[key] = event[key]
    try:
        return SystemOneRequest.model_validate(body)
    except pydantic_core.ValidationError as exc:
        raise error_from_validation(exc) from None
    except RecursionError:
        raise RequestError(DlqReason.bad_json, "value is nested too deeply") from None


def to_request(
    value: object,
    default_schema: DefaultSchema,
    limits: RequestLimits = DEFAULT_LIMITS,
) -> SystemOneRequest:
    """Turn a record value into a request. Pure; raises `RequestError` only.

    `value` is raw JSON (bytes/str, size-checked first), an already decoded JSON value, or a
    `SystemOneRequest` (returned as is). An object with a `questions` key is validated as a SystemOne
    body; any other object is an event (`event_to_request`). Other JSON values (arrays, strings,
    numbers, null) are `not_an_object`; None (a tombstone) is `empty_value`.
    """
    if isinstance(value, SystemOneRequest):
        return value
    if value is None:
        raise RequestError(DlqReason.empty_value, "value is empty (tombstone)")
    decoded = (
        _decode_json(value, limits) if isinstance(value, bytes | bytearray | memoryview | str) else value
    )
    if not isinstance(decoded, Mapping):
        raise RequestError(DlqReason.not_an_object, "record value must be a JSON object")
    if "questions" in decoded:
        return parse_request(decoded, limits)
    return event_to_request(decoded, default_schema)
