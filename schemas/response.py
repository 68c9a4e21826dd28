"""SystemOne response models and `build_response`, the one place answers are made from probabilities.

Numbers in a response (SPEC section 2):
- Probabilities are normalised, then rounded to 4 decimals by largest remainder on integer units of
  1e-4, so the returned values sum to exactly 10000 units (1 within float printing error, far below 1e-4).
  Largest remainder never inverts the order of two probabilities, so the returned choice always has a
  maximal returned probability.
- `choice` = argmax of the returned probabilities; ties go to the first option in request order (the
  rounding also hands its spare units to request-order-first options on exact ties, so an exact model tie
  is decided for the first option in request order). Score `mode` = argmax of the returned probabilities,
  ties to the lowest level.
- `score` = sum(i * p_i) over the *returned* probabilities (exact to 4 decimals).
- `noul` = returned P(true); `confidence` from the returned probabilities, rounded to 4 decimals, in [0, 1].
- Non-finite, negative (beyond -1e-6) or all-zero probabilities raise `ProbabilityError` (a model bug
  must not become a plausible-looking answer; the engine dead-letters the record as `engine_failed`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, WithJsonSchema

from schemas.request import (
    ChoiceQuestion,
    NoulQuestion,
    ScoreQuestion,
    SystemOneRequest,
    option_table,
)

ConfidenceFormula = Literal["typesafe", "top"]

LegendValue = Annotated[
    JsonValue,
    WithJsonSchema(
        {
            "anyOf": [{"type": "string"}, {"type": "object"}, {"type": "array"}],
            "description": 'the level\'s criteria value as the request gave it; a null level is ""',
        }
    ),
]
"""A score level's description in the legend: the request's value itself (a string, object or array), or
`""` for a level given as null (SPEC 2: the Jev contract allows no null there)."""

DECIMALS: Final = 4
_UNITS: Final = 10**DECIMALS
_NEGATIVE_TOLERANCE: Final = 1e-6


class ProbabilityError(ValueError):
    """Probabilities given to `build_response` are unusable (NaN, inf, negative, all zero, wrong shape)."""


class NoulAnswer(BaseModel):
    model_config = ConfigDict(frozen=True, json_schema_serialization_defaults_required=True)

    type: Literal["noul"] = "noul"
    noul: float = Field(ge=0.0, le=1.0, description="P(true), 4 decimals")


class ChoiceAnswer(BaseModel):
    model_config = ConfigDict(frozen=True, json_schema_serialization_defaults_required=True)

    type: Literal["choice"] = "choice"
    choice: str
    confidence: float = Field(ge=0.0, le=1.0)
    probabilities: dict[str, float] = Field(description="option id -> probability, request order")


class ScoreAnswer(BaseModel):
    model_config = ConfigDict(frozen=True, json_schema_serialization_defaults_required=True)

    type: Literal["score"] = "score"
    score: float = Field(ge=0.0, description="sum(i * p_i) over the returned probabilities")
    confidence: float = Field(ge=0.0, le=1.0)
    legend: dict[str, LegendValue] = Field(
        description='level "i" -> its criteria value as given (objects, arrays and "" kept; null is "")'
    )
    probabilities: dict[str, float]


Answer = Annotated[NoulAnswer | ChoiceAnswer | ScoreAnswer, Field(discriminator="type")]


class Usage(BaseModel):
    model_config = ConfigDict(frozen=True, json_schema_serialization_defaults_required=True)

    input_tokens: int = Field(ge=0)
    output_tokens: int = 0


class SystemOneResponse(BaseModel):
    """A SystemOne response body. `x_state_truncated` is only serialised when set (extras are `x_`)."""

    model_config = ConfigDict(frozen=True, json_schema_serialization_defaults_required=True)

    model: str
    answers: dict[str, Answer]
    usage: Usage
    x_state_truncated: bool | None = Field(default=None, exclude_if=lambda value: value is None)

    def to_json(self) -> bytes:
        """UTF-8 JSON bytes of the response (non-ASCII kept as is)."""
        return self.model_dump_json().encode("utf-8")


def round_probabilities(values: Sequence[float], tie_rank: Sequence[int] | None = None) -> list[int]:
    """Normalise `values` and round them to integer units of 1e-4 that sum to exactly 10000.

    Largest remainder: floor every share, then hand the missing units to the largest remainders; equal
    remainders go first to the lower `tie_rank[i]` (default: the lower index). Raises `ProbabilityError`
    for an empty sequence, non-finite or negative values, or a zero sum.
    """
    if len(values) == 0:
        raise ProbabilityError("no probabilities")
    clean: list[float] = []
    for raw in values:
        value = float(raw)
        if not math.isfinite(value) or value < -_NEGATIVE_TOLERANCE:
            raise ProbabilityError(f"probability is not a finite non-negative number: {value!r}")
        clean.append(max(value, 0.0))
    peak = max(clean)
    if not peak > 0.0:
        raise ProbabilityError("probabilities sum to zero")
    clean = [value / peak for value in clean]  # any positive scale is fine; keeps the sum finite
    total = math.fsum(clean)
    scaled = [value / total * _UNITS for value in clean]
    units = [min(math.floor(share), _UNITS) for share in scaled]
    missing = _UNITS - sum(units)
    rank = list(range(len(units))) if tie_rank is None else list(tie_rank)
    by_remainder = sorted(range(len(units)), key=lambda i: (-(scaled[i] - units[i]), rank[i]))
    step = 0
    while missing > 0:
        units[by_remainder[step % len(units)]] += 1
        missing -= 1
        step += 1
    step = len(units) - 1
    while missing < 0:  # only reachable through float error in the shares; take from the smallest remainders
        index = by_remainder[step % len(units)]
        if units[index] > 0:
            units[index] -= 1
            missing += 1
        step -= 1
    return units


def _to_float(units: int) -> float:
    return round(units / _UNITS, DECIMALS)


def _argmax_first(values: Sequence[float]) -> int:
    best = 0
    for index, value in enumerate(values):
        if value > values[best]:
            best = index
    return best


def choice_confidence(top: float, n: int, formula: ConfidenceFormula) -> float:
    """TypeSafe: (p_max - 1/n) / (1 - 1/n); `top`: p_max. Clamped to [0, 1], 4 decimals."""
    value = top if formula == "top" else (top - 1.0 / n) / (1.0 - 1.0 / n)
    return round(min(max(value, 0.0), 1.0), DECIMALS)


def score_confidence(probs: Sequence[float], formula: ConfidenceFormula) -> float:
    """TypeSafe: 1 - spread / uniform_spread with spread = sum(p_i |i - mode|), mode = argmax level
    (ties to the lowest), uniform_spread = sum(|i - (n-1)/2|) / n, floored at 0; `top`: p_max."""
    mode = _argmax_first(probs)
    if formula == "top":
        value = probs[mode]
    else:
        n = len(probs)
        spread = math.fsum(p * abs(i - mode) for i, p in enumerate(probs))
        uniform_spread = math.fsum(abs(i - (n - 1) / 2) for i in range(n)) / n
        value = 1.0 - spread / uniform_spread
    return round(min(max(value, 0.0), 1.0), DECIMALS)


def _noul_answer(raw: Sequence[float]) -> NoulAnswer:
    return NoulAnswer(noul=_to_float(round_probabilities(raw)[0]))


def _choice_answer(
    question: ChoiceQuestion, raw: Sequence[float], formula: ConfidenceFormula
) -> ChoiceAnswer:
    request_order = list(question.criteria)
    position = {key: index for index, key in enumerate(request_order)}
    encoded = [option.id for option in option_table(question)]
    units = round_probabilities(raw, tie_rank=[position[key] for key in encoded])
    by_request = dict(zip(encoded, units, strict=True))
    ordered = [by_request[key] for key in request_order]
    best = _argmax_first(ordered)
    return ChoiceAnswer(
        choice=request_order[best],
        confidence=choice_confidence(ordered[best] / _UNITS, len(units), formula),
        probabilities={key: _to_float(by_request[key]) for key in request_order},
    )


def legend_value(level: JsonValue) -> JsonValue:
    """A score level as its legend answers it: the request's value itself, except null, which is `""`
    (SPEC 2). Pure; never turns a value into text."""
    return "" if level is None else level


def _score_answer(question: ScoreQuestion, raw: Sequence[float], formula: ConfidenceFormula) -> ScoreAnswer:
    units = round_probabilities(raw)
    returned = [u / _UNITS for u in units]
    score_units = sum(index * u for index, u in enumerate(units))
    return ScoreAnswer(
        score=round(score_units / _UNITS, DECIMALS),
        confidence=score_confidence(returned, formula),
        legend={str(i): legend_value(level) for i, level in enumerate(question.criteria)},
        probabilities={str(i): _to_float(u) for i, u in enumerate(units)},
    )


def build_response(
    request: SystemOneRequest,
    probabilities: Mapping[str, Sequence[float]],
    *,
    input_tokens: int,
    state_truncated: bool = False,
    confidence_formula: ConfidenceFormula = "typesafe",
) -> SystemOneResponse:
    """Make the response for `request` from per-question probabilities in `option_table` order.

    Pure and thread-safe. `probabilities` must have exactly one entry per question with one value per
    option (any scale; each vector is normalised). Answers come out in request order.
    Raises `ProbabilityError` (a ValueError) for a missing/extra question, a wrong length, or values
    that are NaN, infinite, negative or all zero.
    """
    extra = set(probabilities) - set(request.questions)
    if extra:
        raise ProbabilityError(f"probabilities for {len(extra)} unknown question(s)")
    answers: dict[str, NoulAnswer | ChoiceAnswer | ScoreAnswer] = {}
    for qid, question in request.questions.items():
        raw = probabilities.get(qid)
        if raw is None:
            raise ProbabilityError(f"no probabilities for question {qid[:100]!r}")
        expected = len(option_table(question))
        if len(raw) != expected:
            raise ProbabilityError(f"question {qid[:100]!r}: {len(raw)} probabilities for {expected} options")
        if isinstance(question, NoulQuestion):
            answers[qid] = _noul_answer(raw)
        elif isinstance(question, ChoiceQuestion):
            answers[qid] = _choice_answer(question, raw, confidence_formula)
        else:
            answers[qid] = _score_answer(question, raw, confidence_formula)
    return SystemOneResponse(
        model=request.model,
        answers=answers,
        usage=Usage(input_tokens=input_tokens),
        x_state_truncated=True if state_truncated else None,
    )
