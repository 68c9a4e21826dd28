"""build_response: rounding, argmax and ties, score, legend, confidence formulas, order, NaN safety."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from schemas.systemone import (
    ChoiceAnswer,
    NoulAnswer,
    ProbabilityError,
    ScoreAnswer,
    SystemOneRequest,
    SystemOneResponse,
    build_response,
    option_table,
    parse_request,
    round_probabilities,
)


def request(questions: dict[str, Any], model: str = "clef-omni") -> SystemOneRequest:
    return parse_request({"model": model, "state": "s", "questions": questions})


CHOICE = {
    "type": "choice",
    "criteria": {"zeta": "z", "alpha": "a", "mid": None},
}  # encoding order alpha, mid, zeta
SCORE = {"type": "score", "criteria": ["low", {"lvl": "mid"}, None, "critical"]}


def one(questions: dict[str, Any], probs: Mapping[str, Sequence[float]], **kwargs: Any) -> SystemOneResponse:
    return build_response(request(questions), probs, input_tokens=12, **kwargs)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1, 1, 1], [3334, 3333, 3333]),
        ([0.5, 0.5], [5000, 5000]),
        ([2, 0], [10000, 0]),
        ([0.12345, 0.87655], [1235, 8765]),  # remainders .5/.5 -> lower index gets the unit
        ([1e-9, 1, 1e-9], [0, 10000, 0]),
        ([-1e-8, 1.0], [0, 10000]),
        ([1e308, 1e308], [5000, 5000]),
        ([1e-320, 3e-320], [2500, 7500]),
    ],
)
def test_round_probabilities(values: list[float], expected: list[int]) -> None:
    units = round_probabilities(values)
    assert units == expected
    assert sum(units) == 10_000


def test_round_probabilities_tie_rank() -> None:
    assert round_probabilities([1, 1, 1], tie_rank=[2, 0, 1]) == [3333, 3334, 3333]


@pytest.mark.parametrize(
    "values",
    [[], [math.nan, 1.0], [math.inf, 1.0], [-math.inf, 1.0], [-0.1, 1.1], [0.0, 0.0]],
)
def test_round_probabilities_refuses_unusable_values(values: list[float]) -> None:
    with pytest.raises(ProbabilityError):
        round_probabilities(values)


def test_noul_answer() -> None:
    response = one({"n": {"type": "noul"}}, {"n": [0.73219, 0.26781]})
    assert response.answers["n"] == NoulAnswer(noul=0.7322)
    assert one({"n": {"type": "noul"}}, {"n": [3.0, 1.0]}).answers["n"] == NoulAnswer(noul=0.75)


def test_choice_maps_encoding_order_to_request_order() -> None:
    # probabilities arrive in option_table order: alpha, mid, zeta
    assert [o.id for o in option_table(request({"c": CHOICE}).questions["c"])] == ["alpha", "mid", "zeta"]
    answer = one({"c": CHOICE}, {"c": [0.2, 0.1, 0.7]}).answers["c"]
    assert isinstance(answer, ChoiceAnswer)
    assert list(answer.probabilities) == ["zeta", "alpha", "mid"]
    assert answer.probabilities == {"zeta": 0.7, "alpha": 0.2, "mid": 0.1}
    assert answer.choice == "zeta"
    assert answer.confidence == pytest.approx((0.7 - 1 / 3) / (1 - 1 / 3), abs=1e-4)


def test_choice_exact_tie_goes_to_first_in_request_order() -> None:
    answer = one({"c": CHOICE}, {"c": [1.0, 1.0, 1.0]}).answers["c"]
    assert isinstance(answer, ChoiceAnswer)
    assert answer.choice == "zeta"
    assert answer.probabilities["zeta"] == max(answer.probabilities.values())
    two_way = one({"c": CHOICE}, {"c": [0.5, 0.0, 0.5]}).answers["c"]  # alpha and zeta tie
    assert isinstance(two_way, ChoiceAnswer)
    assert two_way.choice == "zeta"


def test_choice_top_formula() -> None:
    answer = one({"c": CHOICE}, {"c": [0.2, 0.1, 0.7]}, confidence_formula="top").answers["c"]
    assert isinstance(answer, ChoiceAnswer)
    assert answer.confidence == 0.7


def test_score_answer() -> None:
    answer = one({"s": SCORE}, {"s": [0.1, 0.2, 0.3, 0.4]}).answers["s"]
    assert isinstance(answer, ScoreAnswer)
    assert answer.score == pytest.approx(0 * 0.1 + 1 * 0.2 + 2 * 0.3 + 3 * 0.4)
    # the criteria values as given, never rendered to text; a null level is "" (SPEC 2)
    assert answer.legend == {"0": "low", "1": {"lvl": "mid"}, "2": "", "3": "critical"}
    assert list(answer.probabilities) == ["0", "1", "2", "3"]
    # mode 3, spread = 0.1*3 + 0.2*2 + 0.3*1 = 1.0, uniform spread = (1.5+0.5+0.5+1.5)/4 = 1.0
    assert answer.confidence == 0.0
    sharp = one({"s": SCORE}, {"s": [0.0, 0.9, 0.1, 0.0]}).answers["s"]
    assert isinstance(sharp, ScoreAnswer)
    assert sharp.confidence == pytest.approx(0.9)  # 1 - 0.1/1.0
    top = one({"s": SCORE}, {"s": [0.0, 0.9, 0.1, 0.0]}, confidence_formula="top").answers["s"]
    assert isinstance(top, ScoreAnswer)
    assert top.confidence == 0.9


def test_score_uses_returned_probabilities() -> None:
    answer = one({"s": {"type": "score", "criteria": ["a", "b", "c"]}}, {"s": [1, 1, 1]}).answers["s"]
    assert isinstance(answer, ScoreAnswer)
    probs = answer.probabilities
    assert probs == {"0": 0.3334, "1": 0.3333, "2": 0.3333}
    assert answer.score == round(1 * probs["1"] + 2 * probs["2"], 4) == 0.9999
    assert answer.confidence == 0.0  # uniform -> floored at 0


def test_confidence_bounds_for_certain_answers() -> None:
    choice = one({"c": CHOICE}, {"c": [0, 0, 1]}).answers["c"]
    score = one({"s": SCORE}, {"s": [0, 0, 0, 1]}).answers["s"]
    assert isinstance(choice, ChoiceAnswer)
    assert isinstance(score, ScoreAnswer)
    assert (choice.confidence, score.confidence, score.score) == (1.0, 1.0, 3.0)


def test_answers_in_request_order_and_usage_and_model() -> None:
    questions = {"z": {"type": "noul"}, "c": CHOICE, "a": SCORE}
    response = one(
        questions,
        {"a": [1, 0, 0, 0], "c": [1, 0, 0], "z": [0, 1]},
    )
    assert list(response.answers) == ["z", "c", "a"]
    assert response.model == "clef-omni"
    data = json.loads(response.to_json())
    assert list(data) == ["model", "answers", "usage"]
    assert data["usage"] == {"input_tokens": 12, "output_tokens": 0}
    assert list(data["answers"]) == ["z", "c", "a"]


def test_state_truncated_extra_only_when_set() -> None:
    plain = json.loads(one({"n": {"type": "noul"}}, {"n": [1, 1]}).to_json())
    assert "x_state_truncated" not in plain
    truncated = json.loads(one({"n": {"type": "noul"}}, {"n": [1, 1]}, state_truncated=True).to_json())
    assert truncated["x_state_truncated"] is True
    assert all(not key.startswith("x_") or key == "x_state_truncated" for key in truncated)


@pytest.mark.parametrize(
    "probs",
    [
        {},  # missing question
        {"n": [1.0, 0.0], "other": [1.0, 0.0]},  # unknown question
        {"n": [1.0]},  # wrong length
        {"n": [1.0, 0.0, 0.0]},
        {"n": [math.nan, 0.5]},
        {"n": [0.0, 0.0]},
    ],
)
def test_build_response_refuses_bad_probabilities(probs: dict[str, list[float]]) -> None:
    with pytest.raises(ProbabilityError):
        one({"n": {"type": "noul"}}, probs)


def test_response_round_trips_through_json() -> None:
    response = one(
        {"c": CHOICE, "s": SCORE, "n": {"type": "noul"}}, {"c": [1, 2, 3], "s": [1, 2, 3, 4], "n": [1, 3]}
    )
    again = SystemOneResponse.model_validate_json(response.to_json())
    assert again == response
    assert again.to_json() == response.to_json()
