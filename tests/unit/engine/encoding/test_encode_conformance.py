"""Encoding and response rules against the vendor reference's answers (the conformance fixture).

No model is loaded: the text cases' input_ids come from the fixture release's tokenizer alone, and the
response checks feed the reference's own raw probabilities through `build_response`. So these hold before, and
independently of, the thinker and head matching the reference (the full-probability conformance test runs
the engine). Media cases are skipped here: their token ids depend on the media processors.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from engine.encoding.encode import TextEncoder
from schemas.systemone import (
    ChoiceAnswer,
    NoulAnswer,
    RequestError,
    ScoreAnswer,
    build_response,
    option_table,
    parse_request,
)

_REPO = Path(__file__).resolve().parents[4]
_CANDIDATES = (
    _REPO / "tests" / "conformance",
    _REPO.parent / "shared" / "conformance",  # the shared fixture next to a checkout (../shared, SPEC)
    _REPO.parent.parent / "shared" / "conformance",
)
_MEDIA_KEYS = ("images", "audio", "videos")
_ROUNDED_TOLERANCE = 1.5e-4  # fixture README: rounded response values against raw values


def _fixture_dir() -> Path | None:
    override = os.environ.get("CLEF_CONFORMANCE_DIR")
    for path in ((Path(override),) if override else ()) + _CANDIDATES:
        if (path / "cases.jsonl").is_file() and (path / "release" / "tokenizer.json").is_file():
            return path
    return None


@cache
def _cases() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    root = _fixture_dir()
    if root is None:
        return []
    with (
        (root / "cases.jsonl").open(encoding="utf-8") as cases,
        (root / "expected.jsonl").open(encoding="utf-8") as expected,
    ):
        pairs = [(json.loads(c), json.loads(e)) for c, e in zip(cases, expected, strict=True)]
    for case, exp in pairs:
        assert case["name"] == exp["name"], "cases.jsonl and expected.jsonl must be in the same order"
    return pairs


def _text_cases() -> list[Any]:
    return [
        pytest.param(case, exp, id=case["name"])
        for case, exp in _cases()
        if not any(case["request"].get(key) for key in _MEDIA_KEYS)
    ] or [pytest.param(None, None, marks=pytest.mark.skip(reason="conformance fixture not found"))]


def _accepted_cases() -> list[Any]:
    return [p for p in _text_cases() if p.values[1] is None or p.values[1]["reference_error"] is None]


@pytest.fixture(scope="module")
def encoder() -> TextEncoder:
    from transformers import PreTrainedTokenizerFast

    root = _fixture_dir()
    assert root is not None
    return TextEncoder(PreTrainedTokenizerFast.from_pretrained(str(root / "release")))


def test_fixture_has_the_text_rules() -> None:
    """Guards the parametrisation: a fixture without these cases would make the checks below vacuous. The
    fixture is vendored in tests/conformance, so a missing one is a failure, not a skip."""
    assert _fixture_dir() is not None, "conformance fixture not found (tests/conformance)"
    names = {p.id for p in _text_cases()}
    for name in ("noul-null-criteria", "instructions-8-forms", "ids-space-emoji", "score-10-mixed"):
        assert name in names


@pytest.mark.parametrize(("case", "expected"), _text_cases())
def test_text_case_input_ids_match_reference(
    case: dict[str, Any], expected: dict[str, Any], encoder: TextEncoder
) -> None:
    if expected["reference_error"] is not None:
        with pytest.raises(RequestError) as info:
            parse_request(case["request"])
        assert 400 <= info.value.status < 500  # refused as a client error, never a 5xx
        return
    encoded = encoder.encode(parse_request(case["request"]))
    assert encoded.num_tokens == expected["input_tokens"]
    ids = list(encoded.input_ids)
    if ids != expected["input_ids"]:
        first = next(
            (i for i, (a, b) in enumerate(zip(ids, expected["input_ids"], strict=False)) if a != b),
            min(len(ids), len(expected["input_ids"])),
        )
        pytest.fail(f"input_ids differ from token {first} on ({len(ids)} vs {expected['input_tokens']})")


def _raw_in_encoding_order(request: Any, answers: dict[str, Any]) -> dict[str, list[float]]:
    return {
        qid: [answers[qid]["probabilities"][option.id] for option in option_table(question)]
        for qid, question in request.questions.items()
    }


@pytest.mark.parametrize(("case", "expected"), _accepted_cases())
def test_text_case_response_fields_match_reference(case: dict[str, Any], expected: dict[str, Any]) -> None:
    """The response fields the fixture README lists, built from the reference's raw probabilities."""
    request = parse_request(case["request"])
    raw = _raw_in_encoding_order(request, expected["answers"])
    ours = json.loads(build_response(request, raw, input_tokens=expected["input_tokens"]).model_dump_json())
    ref = expected["response"]
    assert ours["model"] == ref["model"]
    assert ours["usage"] == ref["usage"]
    assert list(ours["answers"]) == list(ref["answers"])  # question ids in request order
    for qid, ref_answer in ref["answers"].items():
        answer = ours["answers"][qid]
        assert answer["type"] == ref_answer["type"]
        assert set(answer) == set(ref_answer), qid
        exact = expected["answers"][qid]["probabilities"]
        if answer["type"] == "noul":
            assert abs(answer["noul"] - expected["answers"][qid]["noul"]) <= _ROUNDED_TOLERANCE
            continue
        assert list(answer["probabilities"]) == list(ref_answer["probabilities"])  # request order
        for key, value in answer["probabilities"].items():
            assert abs(value - exact[key]) <= _ROUNDED_TOLERANCE, (qid, key)
        if answer["type"] == "choice":
            top, second = sorted(exact.values(), reverse=True)[:2]
            if top - second > 2e-4:
                assert answer["choice"] == ref_answer["choice"]
        else:
            # criteria values exactly as given, except a null level, answered "" (SPEC section 2)
            assert answer["legend"] == {k: "" if v is None else v for k, v in ref_answer["legend"].items()}


def test_answer_models_accept_reference_legends() -> None:
    """A reference response parses into our answer models without changing a legend value."""
    for case, expected in _cases():
        if expected["response"] is None or any(case["request"].get(key) for key in _MEDIA_KEYS):
            continue
        for ref_answer in expected["response"]["answers"].values():
            model = {"noul": NoulAnswer, "choice": ChoiceAnswer, "score": ScoreAnswer}[ref_answer["type"]]
            parsed = model.model_validate(ref_answer)
            if isinstance(parsed, ScoreAnswer):
                assert parsed.legend == ref_answer["legend"]
