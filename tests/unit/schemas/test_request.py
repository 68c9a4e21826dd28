"""SystemOne request rules (SPEC section 2): every rule with accepted and refused inputs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import JsonValue

from schemas.systemone import (
    DEFAULT_FALSE_DESCRIPTION,
    DEFAULT_TRUE_DESCRIPTION,
    ChoiceQuestion,
    DlqReason,
    NoulQuestion,
    Option,
    RequestError,
    ScoreQuestion,
    SystemOneRequest,
    effective_instructions,
    option_table,
    parse_request,
    render_value,
)


def body(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"state": "disk full on db1", "questions": {"q": {"type": "noul"}}}
    base.update(overrides)
    return base


def accepted(value: dict[str, Any]) -> SystemOneRequest:
    request = parse_request(json.dumps(value, ensure_ascii=False).encode("utf-8"))
    assert parse_request(value) == request  # the Mapping path agrees with the JSON path
    return request


def refused(value: dict[str, Any]) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_request(json.dumps(value).encode())
    with pytest.raises(RequestError) as info_mapping:
        parse_request(value)
    assert info.value.reason == info_mapping.value.reason
    assert info.value.status == 422
    assert info.value.reason is DlqReason.schema_violation
    return info.value


def locs(error: RequestError) -> list[list[str | int]]:
    assert error.errors is not None
    return [item["loc"] for item in error.errors]


def test_model_defaults_and_echoes() -> None:
    assert accepted(body()).model == "clef-omni"
    assert accepted(body(model="clef-omni-test")).model == "clef-omni-test"
    refused(body(model=3))


@pytest.mark.parametrize("state", ["text", "", {"a": [1, {"b": None}]}, {}, [1, "two", None], []])
def test_state_string_object_array_accepted(state: object) -> None:
    assert accepted(body(state=state)).state == state


@pytest.mark.parametrize("state", [None, 3, 2.5, True, False])
def test_state_null_number_bool_refused(state: object) -> None:
    assert ["state"] in locs(refused(body(state=state)))


def test_state_required() -> None:
    value = body()
    del value["state"]
    assert ["state"] in locs(refused(value))


def test_questions_required_and_counted() -> None:
    value = body()
    del value["questions"]
    assert ["questions"] in locs(refused(value))
    refused(body(questions={}))
    many = {f"q{i}": {"type": "noul"} for i in range(64)}
    assert len(accepted(body(questions=many)).questions) == 64
    many["q64"] = {"type": "noul"}
    refused(body(questions=many))
    refused(body(questions=[{"type": "noul"}]))


@pytest.mark.parametrize(
    "qid",
    [
        "a",
        "A_b.c-d",
        "x" * 1000,
        "0",
        "département",
        "緊急度",
        "q٣",
        "disk usage",
        "🔥 hot",
        "naïve id ✅",
        "a/b",
        "a:b",
        "q!",
        "tab\t",
        "a\u200bb",
        " ",
        "line\nbreak",
    ],
)
def test_question_id_any_non_empty_string(qid: str) -> None:
    request = accepted(body(questions={qid: {"type": "noul"}}))
    assert list(request.questions) == [qid]  # byte for byte: nothing trimmed or normalised


@pytest.mark.parametrize("qid", ["", "x" * 1001])
def test_question_id_refused(qid: str) -> None:
    refused(body(questions={qid: {"type": "noul"}}))


def test_question_order_is_request_order() -> None:
    ids = ["zeta", "alpha", "mid", "Beta"]
    request = accepted(body(questions={qid: {"type": "noul"} for qid in ids}))
    assert list(request.questions) == ids


@pytest.mark.parametrize("question", [{}, {"type": "yesno"}, {"type": None}, "noul", [], {"type": "NOUL"}])
def test_question_type_refused(question: object) -> None:
    refused(body(questions={"q": question}))


@pytest.mark.parametrize("instructions", [None, "", "Is it down?", {"k": "v"}, [], ["a", 1]])
def test_instructions_accepted(instructions: object) -> None:
    question = accepted(body(questions={"q": {"type": "noul", "instructions": instructions}})).questions["q"]
    assert question.instructions == instructions


@pytest.mark.parametrize("instructions", [1, 2.0, True])
def test_instructions_scalar_refused(instructions: object) -> None:
    refused(body(questions={"q": {"type": "noul", "instructions": instructions}}))


@pytest.mark.parametrize(
    ("instructions", "expected"),
    [(None, "q"), ("", "q"), ({}, {}), ([], []), (" ", " "), ("x", "x"), ({"a": 1}, {"a": 1})],
)
def test_effective_instructions(instructions: object, expected: object) -> None:
    question = accepted(body(questions={"q": {"type": "noul", "instructions": instructions}})).questions["q"]
    assert effective_instructions("q", question) == expected


def test_effective_instructions_missing_uses_id() -> None:
    question = accepted(body(questions={"q": {"type": "noul"}})).questions["q"]
    assert effective_instructions("q", question) == "q"


def test_unknown_keys_ignored() -> None:
    request = accepted(
        body(extra_top=1, questions={"q": {"type": "noul", "weight": 3, "criteria": {"true": "t", "x": 1}}})
    )
    assert "extra_top" not in request.model_dump()
    assert option_table(request.questions["q"])[0] == Option("true", "t")


@pytest.mark.parametrize(
    ("criteria", "expected"),
    [
        (None, (DEFAULT_TRUE_DESCRIPTION, DEFAULT_FALSE_DESCRIPTION)),
        ({}, (DEFAULT_TRUE_DESCRIPTION, DEFAULT_FALSE_DESCRIPTION)),
        ({"true": "up"}, ("up", DEFAULT_FALSE_DESCRIPTION)),
        ({"false": {"d": 1}}, (DEFAULT_TRUE_DESCRIPTION, {"d": 1})),
        ({"true": None, "false": ["x"]}, (None, ["x"])),
        ({"true": None}, (None, DEFAULT_FALSE_DESCRIPTION)),
        ({"false": None}, (DEFAULT_TRUE_DESCRIPTION, None)),
        ({"true": None, "false": None}, (None, None)),
        ({"true": "", "false": ""}, ("", "")),
        ({"true": "y", "false": "n"}, ("y", "n")),
    ],
)
def test_noul_criteria(criteria: object, expected: tuple[JsonValue, JsonValue]) -> None:
    question = {"type": "noul"} if criteria is None else {"type": "noul", "criteria": criteria}
    request = accepted(body(questions={"q": question}))
    assert isinstance(request.questions["q"], NoulQuestion)
    assert option_table(request.questions["q"]) == [Option("true", expected[0]), Option("false", expected[1])]


def test_noul_criteria_null_keeps_defaults() -> None:
    request = accepted(body(questions={"q": {"type": "noul", "criteria": None}}))
    defaults = [Option("true", DEFAULT_TRUE_DESCRIPTION), Option("false", DEFAULT_FALSE_DESCRIPTION)]
    assert option_table(request.questions["q"]) == defaults


def test_noul_explicit_null_survives_a_copy() -> None:
    # The consumer builds event requests with model_copy; the set of given keys must travel with it.
    request = accepted(body(questions={"q": {"type": "noul", "criteria": {"true": None}}}))
    copy = request.model_copy(update={"state": "other"})
    assert option_table(copy.questions["q"])[0] == Option("true", None)


@pytest.mark.parametrize("criteria", [[], "x", 1, {"true": 1}])
def test_noul_criteria_refused(criteria: object) -> None:
    refused(body(questions={"q": {"type": "noul", "criteria": criteria}}))


def test_choice_options_sorted_for_encoding_and_kept_for_request() -> None:
    criteria = {"b": "bee", "a": None, "B": {"k": 1}, "é": ["x"], "10": "ten", "9": "nine"}
    request = accepted(body(questions={"c": {"type": "choice", "criteria": criteria}}))
    question = request.questions["c"]
    assert isinstance(question, ChoiceQuestion)
    assert list(question.criteria) == list(criteria)
    assert [o.id for o in option_table(question)] == ["10", "9", "B", "a", "b", "é"]
    assert option_table(question)[3] == Option("a", None)


@pytest.mark.parametrize("count", [2, 3, 255])
def test_choice_counts_accepted(count: int) -> None:
    criteria = {f"o{i}": None for i in range(count)}
    assert (
        len(
            option_table(
                accepted(body(questions={"c": {"type": "choice", "criteria": criteria}})).questions["c"]
            )
        )
        == count
    )


@pytest.mark.parametrize(
    "criteria",
    [
        None,
        {"only": "one"},
        {f"o{i}": None for i in range(256)},
        ["a", "b"],
        {"a": 1, "b": "x"},
        {"a": True, "b": "x"},
        {"": "empty id", "b": "x"},
        {"x" * 1001: "long id", "b": "x"},
    ],
)
def test_choice_refused(criteria: object) -> None:
    question: dict[str, Any] = {"type": "choice"}
    if criteria is not None:
        question["criteria"] = criteria
    refused(body(questions={"c": question}))


@pytest.mark.parametrize("levels", [["lo", "hi"], [None, {"a": 1}, ["x"]], [f"l{i}" for i in range(10)]])
def test_score_levels_accepted(levels: list[JsonValue]) -> None:
    question = accepted(body(questions={"s": {"type": "score", "criteria": levels}})).questions["s"]
    assert isinstance(question, ScoreQuestion)
    assert option_table(question) == [Option(str(i), level) for i, level in enumerate(levels)]


@pytest.mark.parametrize(
    "levels", [None, ["one"], [f"l{i}" for i in range(11)], {"0": "lo", "1": "hi"}, "lo,hi", ["a", 1]]
)
def test_score_levels_refused(levels: object) -> None:
    question: dict[str, Any] = {"type": "score"}
    if levels is not None:
        question["criteria"] = levels
    error = refused(body(questions={"s": question}))
    assert any(loc[:3] == ["questions", "s", "score"] for loc in locs(error))


@pytest.mark.parametrize(("key", "limit"), [("images", 4), ("audio", 4), ("videos", 2)])
def test_media_counts(key: str, limit: int) -> None:
    items = [f"data:x;base64,{i}" for i in range(limit)]
    assert getattr(accepted(body(**{key: items})), key) == items
    assert getattr(accepted(body(**{key: None})), key) is None
    assert getattr(accepted(body(**{key: []})), key) == []
    refused(body(**{key: [*items, "one more"]}))


@pytest.mark.parametrize("item", [None, 1, 2.5, True, {"url": "x"}, ["x"]])
def test_media_items_must_be_strings_on_the_wire(item: object) -> None:
    refused(body(images=[item]))


def test_media_python_objects_pass_through() -> None:
    class FakeImage:
        pass

    image = FakeImage()
    request = parse_request(body(images=[image], audio=[b"raw"]))
    assert request.images == [image]
    assert request.has_media


def test_media_not_a_list_refused() -> None:
    refused(body(images="data:..."))
    refused(body(videos={"0": "x"}))


def test_request_is_frozen() -> None:
    request = accepted(body())
    with pytest.raises(ValueError, match="frozen"):
        request.model = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain é", "plain é"),
        ({"b": 1, "a": "é"}, '{"a":"é","b":1}'),
        ([1, None], "[1,null]"),
        (None, "null"),
    ],
)
def test_render_value(value: object, text: str) -> None:
    assert render_value(value) == text  # type: ignore[arg-type]
