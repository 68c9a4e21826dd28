"""The SystemOne wire contract in one import: request, options, parsing, response, errors.

Implementation lives in `schemas.request` (models, option tables), `schemas.parse` (limits, parsing),
`schemas.response` (answers, rounding, confidence) and `schemas.errors` (reason codes, `RequestError`).
"""

from schemas.errors import DlqReason, RequestError
from schemas.parse import DEFAULT_LIMITS, RequestLimits, check_value_size, parse_request
from schemas.request import (
    DEFAULT_FALSE_DESCRIPTION,
    DEFAULT_TRUE_DESCRIPTION,
    MAX_QUESTIONS,
    ChoiceQuestion,
    MediaItem,
    NoulCriteria,
    NoulQuestion,
    Option,
    Question,
    ScoreQuestion,
    SystemOneRequest,
    effective_instructions,
    option_table,
    render_value,
)
from schemas.response import (
    Answer,
    ChoiceAnswer,
    ConfidenceFormula,
    NoulAnswer,
    ProbabilityError,
    ScoreAnswer,
    SystemOneResponse,
    Usage,
    build_response,
    round_probabilities,
)

__all__ = [
    "DEFAULT_FALSE_DESCRIPTION",
    "DEFAULT_LIMITS",
    "DEFAULT_TRUE_DESCRIPTION",
    "MAX_QUESTIONS",
    "Answer",
    "ChoiceAnswer",
    "ChoiceQuestion",
    "ConfidenceFormula",
    "DlqReason",
    "MediaItem",
    "NoulAnswer",
    "NoulCriteria",
    "NoulQuestion",
    "Option",
    "ProbabilityError",
    "Question",
    "RequestError",
    "RequestLimits",
    "ScoreAnswer",
    "ScoreQuestion",
    "SystemOneRequest",
    "SystemOneResponse",
    "Usage",
    "build_response",
    "check_value_size",
    "effective_instructions",
    "option_table",
    "parse_request",
    "render_value",
    "round_probabilities",
]
