"""Property tests (hypothesis): response invariants, total error handling, Unicode round-trips."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.envelope import DefaultSchema, to_request
from schemas.systemone import (
    ChoiceAnswer,
    ChoiceQuestion,
    NoulAnswer,
    NoulQuestion,
    RequestError,
    ScoreAnswer,
    SystemOneRequest,
    build_response,
    option_table,
    parse_request,
)

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Unicode without surrogates (those cannot be UTF-8 encoded, so they never arrive over the wire).
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
# Any non-empty string is a question id (SPEC section 2): spaces, emoji, "/", ":" and controls included.
QUESTION_ID = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=40)
OPTION_ID = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=20)
JSON_SCALAR = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT
)
JSON = st.recursive(
    JSON_SCALAR,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
DESCRIPTION = st.none() | TEXT | st.lists(JSON, max_size=3) | st.dictionaries(TEXT, JSON, max_size=3)
STATE = TEXT | st.lists(JSON, max_size=4) | st.dictionaries(TEXT, JSON, max_size=4)

NOUL = st.fixed_dictionaries(
    {"type": st.just("noul")},
    optional={
        "instructions": DESCRIPTION,
        "criteria": st.fixed_dictionaries({}, optional={"true": DESCRIPTION, "false": DESCRIPTION}),
    },
)
CHOICE = st.fixed_dictionaries(
    {"type": st.just("choice"), "criteria": st.dictionaries(OPTION_ID, DESCRIPTION, min_size=2, max_size=12)},
    optional={"instructions": DESCRIPTION},
)
SCORE = st.fixed_dictionaries(
    {"type": st.just("score"), "criteria": st.lists(DESCRIPTION, min_size=2, max_size=10)},
    optional={"instructions": DESCRIPTION},
)
REQUEST = st.fixed_dictionaries(
    {
        "state": STATE,
        "questions": st.dictionaries(QUESTION_ID, NOUL | CHOICE | SCORE, min_size=1, max_size=6),
    },
    optional={"model": TEXT, "images": st.lists(TEXT, max_size=4), "videos": st.lists(TEXT, max_size=2)},
)
PROBABILITY = (
    st.floats(min_value=0.0, max_value=1.0) | st.floats(min_value=0.0, max_value=1e300) | st.just(0.0)
)


def no_constants(name: str) -> float:
    raise AssertionError(f"non-JSON constant {name} in output")


def probability_vectors(draw: st.DrawFn, request: SystemOneRequest) -> dict[str, list[float]]:
    vectors: dict[str, list[float]] = {}
    for qid, question in request.questions.items():
        n = len(option_table(question))
        vector = draw(st.lists(PROBABILITY, min_size=n, max_size=n))
        if not any(value > 0 for value in vector):
            vector[draw(st.integers(0, n - 1))] = draw(st.floats(min_value=1e-300, max_value=1.0))
        vectors[qid] = vector
    return vectors


@st.composite
def request_and_probabilities(draw: st.DrawFn) -> tuple[SystemOneRequest, dict[str, list[float]]]:
    body = draw(REQUEST)
    request = parse_request(json.dumps(body, ensure_ascii=False).encode("utf-8"))
    return request, probability_vectors(draw, request)


def check_distribution(probabilities: dict[str, float]) -> None:
    values = list(probabilities.values())
    assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in values)
    assert abs(math.fsum(values) - 1.0) <= 1e-4
    assert sum(round(v * 10_000) for v in values) == 10_000  # exact: whole units of 1e-4
    assert all(round(v, 4) == v for v in values)


@PROPERTY
@given(request_and_probabilities(), st.sampled_from(["typesafe", "top"]), st.booleans())
def test_response_invariants(
    case: tuple[SystemOneRequest, dict[str, list[float]]], formula: Any, truncated: bool
) -> None:
    request, vectors = case
    response = build_response(
        request, vectors, input_tokens=7, state_truncated=truncated, confidence_formula=formula
    )
    data = json.loads(response.to_json(), parse_constant=no_constants)
    assert list(data["answers"]) == list(request.questions)
    assert data["model"] == request.model
    assert data["usage"] == {"input_tokens": 7, "output_tokens": 0}
    assert data.get("x_state_truncated", False) is truncated
    for qid, question in request.questions.items():
        answer = response.answers[qid]
        if isinstance(question, NoulQuestion):
            assert isinstance(answer, NoulAnswer)
            assert 0.0 <= answer.noul <= 1.0
            continue
        assert isinstance(answer, ChoiceAnswer | ScoreAnswer)
        check_distribution(answer.probabilities)
        assert 0.0 <= answer.confidence <= 1.0
        probs = list(answer.probabilities.values())
        top = max(probs)
        n = len(probs)
        if isinstance(question, ChoiceQuestion):
            assert isinstance(answer, ChoiceAnswer)
            assert list(answer.probabilities) == list(question.criteria)
            assert answer.probabilities[answer.choice] == top
            first_top = next(key for key, value in answer.probabilities.items() if value == top)
            assert answer.choice == first_top
            expected = top if formula == "top" else (top - 1 / n) / (1 - 1 / n)
        else:
            assert isinstance(answer, ScoreAnswer)
            assert list(answer.probabilities) == [str(i) for i in range(n)]
            given = {str(i): "" if level is None else level for i, level in enumerate(question.criteria)}
            assert answer.legend == given  # as given, a null level as "" (SPEC 2)
            assert abs(answer.score - sum(i * p for i, p in enumerate(probs))) <= 1e-4
            assert 0.0 <= answer.score <= n - 1
            mode = probs.index(top)
            spread = sum(p * abs(i - mode) for i, p in enumerate(probs))
            uniform = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
            expected = top if formula == "top" else max(0.0, 1 - spread / uniform)
        assert abs(answer.confidence - expected) <= 1e-4


def outcome(parse: Callable[[Any], object], value: object) -> RequestError | None:
    """None when `value` parses; the RequestError otherwise (any other exception propagates)."""
    try:
        parse(value)
    except RequestError as error:
        return error
    return None


def assert_client_error(error: RequestError | None) -> None:
    if error is not None:
        assert 400 <= error.status < 500
        json.dumps(error.body())


def parse_event(value: object) -> SystemOneRequest:
    return to_request(value, DefaultSchema())


@PROPERTY
@given(JSON)
def test_random_json_values_never_crash(value: object) -> None:
    for candidate in (value, {"state": value, "questions": value}, {"state": "s", "questions": {"q": value}}):
        assert_client_error(outcome(parse_request, json.dumps(candidate).encode()))
        assert_client_error(outcome(parse_event, json.dumps(candidate).encode()))


@PROPERTY
@given(
    st.dictionaries(st.sampled_from(["state", "questions", "model", "images", "audio", "videos", "x"]), JSON)
)
def test_random_request_shaped_objects_never_crash(value: dict[str, Any]) -> None:
    for parse in (parse_request, parse_event):
        assert_client_error(outcome(parse, json.dumps(value).encode()))
        assert_client_error(outcome(parse, value))


@PROPERTY
@given(st.binary(max_size=200))
def test_random_bytes_never_crash(raw: bytes) -> None:
    assert_client_error(outcome(parse_request, raw))
    assert_client_error(outcome(parse_event, raw))


@PROPERTY
@given(st.text(max_size=200))
def test_random_text_never_crashes(raw: str) -> None:
    assert_client_error(outcome(parse_request, raw))


@PROPERTY
@given(request_and_probabilities())
def test_unicode_round_trips_byte_for_byte(case: tuple[SystemOneRequest, dict[str, list[float]]]) -> None:
    request, vectors = case
    again = parse_request(request.model_dump_json().encode("utf-8"))
    assert again == request
    assert (
        json.dumps(again.state, ensure_ascii=False).encode()
        == json.dumps(request.state, ensure_ascii=False).encode()
    )
    response = json.loads(build_response(request, vectors, input_tokens=1).to_json().decode("utf-8"))
    for qid, question in request.questions.items():
        assert qid in response["answers"]
        if isinstance(question, ChoiceQuestion):
            returned = list(response["answers"][qid]["probabilities"])
            assert [key.encode() for key in returned] == [key.encode() for key in question.criteria]


@PROPERTY
@given(st.dictionaries(TEXT.filter(lambda k: k not in {"questions"}), JSON, max_size=6))
def test_event_state_round_trips(event: dict[str, Any]) -> None:
    raw = json.dumps(event, ensure_ascii=False).encode("utf-8")
    error = outcome(parse_event, raw)
    if error is not None:
        assert error.reason.value == "schema_violation"  # only a malformed media entry may fail
        assert any(key in event for key in ("images", "audio", "videos"))
        return
    request = parse_event(raw)
    expected = {k: v for k, v in event.items() if k not in ("images", "audio", "videos")}
    assert (
        json.dumps(request.state, ensure_ascii=False).encode()
        == json.dumps(expected, ensure_ascii=False).encode()
    )
