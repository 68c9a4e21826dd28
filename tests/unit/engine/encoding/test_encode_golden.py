"""Golden tests: exact token sequences and spans of `engine.encoding.encode.encode_request` (SPEC section
5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from engine.encoding.encode import encode_request
from engine.types import TYPE_CHOICE, TYPE_NOUL, TYPE_SCORE, EncodedRequest
from schemas.systemone import SystemOneRequest
from tests.unit.engine.encoding.text_golden import (
    ALLOWED,
    END,
    FALSE_DEFAULT,
    NL,
    SCHEMA,
    TRUE_DEFAULT,
    Expected,
    P,
    X,
    expect,
    field,
    ids_of,
    prompt,
)


@pytest.fixture(params=["bpe", "tiny"])
def tok(request: pytest.FixtureRequest, bpe_tokenizer: Tokenizer) -> Tokenizer:
    """Each golden test runs on the in-test BPE tokenizer and on the tiny release's tokenizer."""
    if request.param == "bpe":
        return bpe_tokenizer
    path: Path = request.getfixturevalue("tiny_release")
    return Tokenizer.from_file(str(path / "tokenizer.json"))


def req(body: dict[str, Any]) -> SystemOneRequest:
    return SystemOneRequest.model_validate(body)


def check(tok: Tokenizer, enc: EncodedRequest, exp: Expected) -> None:
    """Full ids equal the expected concatenation, spans match, and each span decodes to its text."""
    assert list(enc.input_ids) == exp.input_ids
    assert list(enc.question_spans) == exp.question_spans
    assert [s for spans in enc.option_spans for s in spans] == exp.option_spans
    for (start, end), text in zip(enc.question_spans, exp.question_texts, strict=True):
        assert tok.decode(list(enc.input_ids[start:end]), skip_special_tokens=False) == text
    flat = [s for spans in enc.option_spans for s in spans]
    for (start, end), text in zip(flat, exp.option_texts, strict=True):
        assert tok.decode(list(enc.input_ids[start:end]), skip_special_tokens=False) == text


def test_choice_ids_sorted_as_strings_with_object_instructions(tok: Tokenizer) -> None:
    body = {
        "state": {"service": "db-1", "alert": "disk full", "counts": [3, 1]},
        "questions": {
            "department": {
                "type": "choice",
                "instructions": {"z": 1, "a": {"y": [1, 2], "b": "x"}},
                "criteria": {"b": "Bee team", "a": None, "10": {"x": 1, "a": [2]}, "9": ["z", "y"]},
            }
        },
    }
    enc = encode_request(req(body), tok)
    options = [
        '{"description":{"a":[2],"x":1},"option_id":"10"}',
        '{"description":["z","y"],"option_id":"9"}',
        '{"option_id":"a"}',
        '{"description":"Bee team","option_id":"b"}',
    ]
    exp = expect(
        tok,
        prompt(
            '{"alert":"disk full","counts":[3,1],"service":"db-1"}',
            [field(1, "department", "choice", '{"a":{"b":"x","y":[1,2]},"z":1}', options)],
        ),
    )
    check(tok, enc, exp)
    assert enc.question_ids == ("department",)
    assert enc.question_types == (TYPE_CHOICE,)
    assert len(enc.option_spans) == 1
    assert len(enc.option_spans[0]) == 4
    assert enc.state_truncated is False
    assert enc.num_tokens == len(exp.input_ids)


def test_noul_default_and_overridden_descriptions_and_score_levels(tok: Tokenizer) -> None:
    body = {
        "state": "plain text state",
        "questions": {
            "plain": {"type": "noul", "instructions": "Is it down?"},
            "only_true": {"type": "noul", "instructions": "Q2", "criteria": {"true": "Yes, down."}},
            "only_false": {
                "type": "noul",
                "instructions": "Q3",
                "criteria": {"false": {"k": "v", "a": None}},
            },
            "nulls": {"type": "noul", "instructions": "Q4", "criteria": {"true": None, "false": None}},
            "urgency": {
                "type": "score",
                "instructions": ["rate", 1],
                "criteria": ["low", {"b": 1, "a": 2}, None],
            },
        },
    }
    enc = encode_request(req(body), tok)
    true_default = '{"description":"' + TRUE_DEFAULT + '","option_id":"true"}'
    false_default = '{"description":"' + FALSE_DEFAULT + '","option_id":"false"}'
    exp = expect(
        tok,
        prompt(
            "plain text state",
            [
                field(1, "plain", "noul", "Is it down?", [true_default, false_default]),
                field(
                    2,
                    "only_true",
                    "noul",
                    "Q2",
                    ['{"description":"Yes, down.","option_id":"true"}', false_default],
                ),
                field(
                    3,
                    "only_false",
                    "noul",
                    "Q3",
                    [true_default, '{"description":{"a":null,"k":"v"},"option_id":"false"}'],
                ),
                # an explicit null drops the description key (absent keys keep the defaults)
                field(4, "nulls", "noul", "Q4", ['{"option_id":"true"}', '{"option_id":"false"}']),
                field(
                    5,
                    "urgency",
                    "score",
                    '["rate",1]',
                    [
                        '{"description":"low","option_id":"0"}',
                        '{"description":{"a":2,"b":1},"option_id":"1"}',
                        '{"option_id":"2"}',
                    ],
                ),
            ],
        ),
    )
    check(tok, enc, exp)
    assert enc.question_ids == ("plain", "only_true", "only_false", "nulls", "urgency")
    assert enc.question_types == (TYPE_NOUL, TYPE_NOUL, TYPE_NOUL, TYPE_NOUL, TYPE_SCORE)
    assert [len(spans) for spans in enc.option_spans] == [2, 2, 2, 2, 3]


@pytest.mark.parametrize(
    ("instructions", "text"),
    [
        (None, "svc.latency-p99_x"),
        ("", "svc.latency-p99_x"),
        ("absent", "svc.latency-p99_x"),
        ({}, "{}"),  # only missing, null or "" fall back to the id (SPEC section 2)
        ([], "[]"),
    ],
)
def test_instructions_fall_back_to_the_question_id_only_when_missing_null_or_empty_string(
    tok: Tokenizer, instructions: object, text: str
) -> None:
    question: dict[str, Any] = {"type": "noul"}
    if instructions != "absent":
        question["instructions"] = instructions
    enc = encode_request(req({"state": ["a", 1], "questions": {"svc.latency-p99_x": question}}), tok)
    true_default = '{"description":"' + TRUE_DEFAULT + '","option_id":"true"}'
    false_default = '{"description":"' + FALSE_DEFAULT + '","option_id":"false"}'
    exp = expect(
        tok,
        prompt('["a",1]', [field(1, "svc.latency-p99_x", "noul", text, [true_default, false_default])]),
    )
    check(tok, enc, exp)


def test_question_id_with_spaces_emoji_and_punctuation_is_encoded_raw(tok: Tokenizer) -> None:
    qid = "disk usage 🔥 a/b:c"
    enc = encode_request(
        req({"state": "s", "questions": {qid: {"type": "noul", "criteria": {"true": None}}}}), tok
    )
    false_default = '{"description":"' + FALSE_DEFAULT + '","option_id":"false"}'
    exp = expect(tok, prompt("s", [field(1, qid, "noul", qid, ['{"option_id":"true"}', false_default])]))
    check(tok, enc, exp)


def test_unicode_is_kept_raw_in_ids_options_and_state(tok: Tokenizer) -> None:
    body = {
        "state": {"nachricht": "Störung im Rechenzentrum — 数据库 ausgefallen", "ключ": "значение"},
        "questions": {
            "部门": {
                "type": "choice",
                "instructions": "Welche Abteilung? 🚨",
                "criteria": {"网络": "Netzwerk-Team", "データ": {"说明": "数据库"}, "ops": None},
            }
        },
    }
    enc = encode_request(req(body), tok)
    state = '{"nachricht":"Störung im Rechenzentrum — 数据库 ausgefallen","ключ":"значение"}'
    # Sorted by code point: "ops" < "データ" (U+30C7) < "网络" (U+7F51).
    options = [
        '{"option_id":"ops"}',
        '{"description":{"说明":"数据库"},"option_id":"データ"}',
        '{"description":"Netzwerk-Team","option_id":"网络"}',
    ]
    exp = expect(tok, prompt(state, [field(1, "部门", "choice", "Welche Abteilung? 🚨", options)]))
    check(tok, enc, exp)
    assert "\\u" not in tok.decode(list(enc.input_ids), skip_special_tokens=False)


def test_pieces_are_tokenized_separately_and_specials_are_single_ids(tok: Tokenizer) -> None:
    enc = encode_request(req({"state": "x", "questions": {"q": {"type": "noul"}}}), tok)
    for special in ("<|im_start|>", "<|im_end|>", "<think>", "</think>"):
        assert len(ids_of(tok, special)) == 1
        assert ids_of(tok, special)[0] in enc.input_ids
    assert enc.input_ids[: len(ids_of(tok, P))] == tuple(ids_of(tok, P))
    assert enc.input_ids[-len(ids_of(tok, X)) :] == tuple(ids_of(tok, X))


def test_piece_boundaries_change_tokens_for_the_bpe_tokenizer(bpe_tokenizer: Tokenizer) -> None:
    """Guards the golden tests themselves: with this tokenizer, joint tokenization would differ."""
    enc = encode_request(req({"state": "x\n", "questions": {"q": {"type": "noul"}}}), bpe_tokenizer)
    text = bpe_tokenizer.decode(list(enc.input_ids), skip_special_tokens=False)
    assert list(enc.input_ids) != ids_of(bpe_tokenizer, text)


def test_media_tokens_go_between_prefix_and_state(tok: Tokenizer) -> None:
    body = {"state": "s", "questions": {"q": {"type": "noul", "instructions": "I"}}}
    plain = encode_request(req(body), tok)
    media = [7, 8, 9, 9]
    enc = encode_request(req(body), tok, media_tokens=media)
    n_p = len(ids_of(tok, P))
    assert list(enc.input_ids) == [*plain.input_ids[:n_p], *media, *plain.input_ids[n_p:]]
    assert enc.question_spans == tuple((s + 4, e + 4) for s, e in plain.question_spans)
    assert enc.option_spans[0] == tuple((s + 4, e + 4) for s, e in plain.option_spans[0])


def test_constants_cover_every_schema_piece() -> None:
    # The literal pieces of the test module are the SPEC's, character for character.
    assert (SCHEMA, ALLOWED, NL, END) == ("\n\nSCHEMA FIELDS:\n", "\nALLOWED OPTIONS:\n", "\n", "END FIELD\n")
