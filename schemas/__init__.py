"""clef-router wire contract: SystemOne requests/responses, event envelope, routed decisions, DLQ records.

Pure pydantic models and functions; imports nothing else of ours (`schemas` <- `engine` <- `consumer`).
"""

from schemas.dead_letter import (
    DeadLetterInfo,
    DlqHeaderError,
    DlqStage,
    dlq_headers,
    parse_dlq_headers,
    strip_dlq_headers,
    with_dlq_headers,
)
from schemas.envelope import DefaultSchema, event_to_request, to_request
from schemas.errors import DlqReason, RequestError
from schemas.export import json_schemas
from schemas.routing import (
    EngineInfo,
    RoutedDecision,
    RouteSummary,
    SourceRef,
    decision_headers,
    route_summary,
)
from schemas.systemone import (
    Answer,
    ChoiceAnswer,
    ChoiceQuestion,
    ConfidenceFormula,
    NoulAnswer,
    NoulQuestion,
    Option,
    ProbabilityError,
    Question,
    RequestLimits,
    ScoreAnswer,
    ScoreQuestion,
    SystemOneRequest,
    SystemOneResponse,
    Usage,
    build_response,
    option_table,
    parse_request,
)

__all__ = [
    "Answer",
    "ChoiceAnswer",
    "ChoiceQuestion",
    "ConfidenceFormula",
    "DeadLetterInfo",
    "DefaultSchema",
    "DlqHeaderError",
    "DlqReason",
    "DlqStage",
    "EngineInfo",
    "NoulAnswer",
    "NoulQuestion",
    "Option",
    "ProbabilityError",
    "Question",
    "RequestError",
    "RequestLimits",
    "RouteSummary",
    "RoutedDecision",
    "ScoreAnswer",
    "ScoreQuestion",
    "SourceRef",
    "SystemOneRequest",
    "SystemOneResponse",
    "Usage",
    "build_response",
    "decision_headers",
    "dlq_headers",
    "event_to_request",
    "json_schemas",
    "option_table",
    "parse_dlq_headers",
    "parse_request",
    "route_summary",
    "strip_dlq_headers",
    "to_request",
    "with_dlq_headers",
]
