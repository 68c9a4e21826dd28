"""Truncation, errors, tokenizer wrappers and thread safety of `engine.encoding.encode`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from engine.encoding.encode import TextEncoder, encode_request
from schemas.systemone import DlqReason, RequestError, SystemOneRequest
from tests.unit.engine.encoding.text_golden import (
    FALSE_DEFAULT,
    TRUE_DEFAULT,
    P,
    expect,
    field,
    ids_of,
    prompt,
)

STATE = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma"
BODY = {"state": STATE, "questions": {"outage": {"type": "noul", "instructions": "Is it an outage?"}}}
OPTIONS = [
    '{"description":"' + TRUE_DEFAULT + '","option_id":"true"}',
    '{"description":"' + FALSE_DEFAULT + '","option_id":"false"}',
]


def request() -> SystemOneRequest:
    return SystemOneRequest.model_validate(BODY)


def fixed_and_state(tok: Tokenizer) -> tuple[int, list[int]]:
    full = expect(tok, prompt(STATE, [field(1, "outage", "noul", "Is it an outage?", OPTIONS)]))
    state = ids_of(tok, STATE)
    return len(full.input_ids) - len(state), state


def test_no_truncation_at_exactly_the_limit(bpe_tokenizer: Tokenizer) -> None:
    fixed, state = fixed_and_state(bpe_tokenizer)
    enc = encode_request(request(), bpe_tokenizer, max_tokens=fixed + len(state), truncate_state=False)
    assert enc.state_truncated is False
    assert enc.num_tokens == fixed + len(state)


@pytest.mark.parametrize("keep", [0, 1, 5])
def test_overlong_state_keeps_its_head(bpe_tokenizer: Tokenizer, keep: int) -> None:
    tok = bpe_tokenizer
    fixed, state = fixed_and_state(tok)
    assert len(state) > 5
    enc = encode_request(request(), tok, max_tokens=fixed + keep)
    assert enc.state_truncated is True
    assert enc.num_tokens == fixed + keep
    n_p = len(ids_of(tok, P))
    assert list(enc.input_ids[n_p : n_p + keep]) == state[:keep]
    untruncated = encode_request(request(), tok)
    tail = len(untruncated.input_ids) - n_p - len(state)
    assert enc.input_ids[n_p + keep :] == untruncated.input_ids[-tail:]
    # Spans still point at the instruction and options, shifted by the cut.
    cut = len(state) - keep
    assert enc.question_spans == tuple((s - cut, e - cut) for s, e in untruncated.question_spans)
    start, end = enc.question_spans[0]
    assert tok.decode(list(enc.input_ids[start:end]), skip_special_tokens=False) == "Is it an outage?"


def test_schema_alone_over_the_limit_is_rejected(bpe_tokenizer: Tokenizer) -> None:
    fixed, _ = fixed_and_state(bpe_tokenizer)
    with pytest.raises(RequestError) as info:
        encode_request(request(), bpe_tokenizer, max_tokens=fixed - 1)
    assert info.value.reason is DlqReason.context_length_exceeded
    assert info.value.status == 400
    assert info.value.body()["detail"]["error_type"] == "context_length_exceeded"


def test_media_counts_towards_the_fixed_part(bpe_tokenizer: Tokenizer) -> None:
    fixed, _ = fixed_and_state(bpe_tokenizer)
    enc = encode_request(request(), bpe_tokenizer, media_tokens=[5, 5], max_tokens=fixed + 2)
    assert enc.state_truncated is True
    assert enc.num_tokens == fixed + 2
    with pytest.raises(RequestError):
        encode_request(request(), bpe_tokenizer, media_tokens=[5, 5, 5], max_tokens=fixed + 2)


def test_truncate_state_false_rejects_an_overlong_state(bpe_tokenizer: Tokenizer) -> None:
    fixed, state = fixed_and_state(bpe_tokenizer)
    with pytest.raises(RequestError) as info:
        encode_request(request(), bpe_tokenizer, max_tokens=fixed + len(state) - 1, truncate_state=False)
    assert info.value.reason is DlqReason.context_length_exceeded
    assert info.value.status == 400


def test_transformers_tokenizer_and_raw_backend_agree(bpe_tokenizer: Tokenizer) -> None:
    wrapped = PreTrainedTokenizerFast(tokenizer_object=bpe_tokenizer)  # type: ignore[no-untyped-call]
    assert encode_request(request(), wrapped) == encode_request(request(), bpe_tokenizer)


def test_a_tokenizer_without_the_special_tokens_is_refused() -> None:
    vocab = {chr(c): i for i, c in enumerate(range(32, 127))}
    plain = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    plain.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    with pytest.raises(ValueError, match="not a Clef tokenizer"):
        TextEncoder(plain)


def test_concurrent_encoding_matches_sequential(bpe_tokenizer: Tokenizer) -> None:
    bodies = [
        {
            "state": {"n": i, "text": STATE[: i % 50]},
            "questions": {
                f"q{i % 7}": {"type": "choice", "criteria": {f"o{j}": f"d{i % 3}" for j in range(2 + i % 5)}},
                "u": {"type": "score", "criteria": ["a", "b", "c"][: 2 + i % 2]},
            },
        }
        for i in range(200)
    ]
    requests = [SystemOneRequest.model_validate(b) for b in bodies]
    encoder = TextEncoder(bpe_tokenizer, cache_size=16)  # tiny cache: exercises eviction too
    sequential = [TextEncoder(bpe_tokenizer).encode(r) for r in requests]
    with ThreadPoolExecutor(8) as pool:
        parallel = list(pool.map(encoder.encode, requests))
    assert parallel == sequential
