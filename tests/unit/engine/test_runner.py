"""End to end on the tiny release (CPU, float32): Engine.decide, systemone(), response invariants."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, EngineConfig, load_release_model, systemone
from engine.batching.cut import BatchLimits
from engine.encoding.encode import encode_request
from schemas.systemone import (
    ChoiceAnswer,
    ChoiceQuestion,
    DlqReason,
    NoulAnswer,
    RequestError,
    ScoreAnswer,
    ScoreQuestion,
    SystemOneRequest,
    SystemOneResponse,
)

CHOICE = {
    "type": "choice",
    "instructions": "Which team?",
    "criteria": {"net": "Network", "db": None, "api": "API"},
}
SCORE = {"type": "score", "criteria": ["low", "medium", "high", {"level": "critical"}]}
NOUL = {"type": "noul", "criteria": {"false": "No outage"}}
VALID: list[dict[str, Any]] = [
    {"model": "m1", "state": "disk full on db-01", "questions": {"department": CHOICE}},
    {
        "state": {"host": "edge-7", "cpu": 0.97, "tags": ["prod"]},
        "questions": {"urgency": SCORE, "outage": NOUL},
    },
    {"state": ["a", "b"] * 40, "questions": {"outage": NOUL, "department": CHOICE, "urgency": SCORE}},
    {
        "state": "Störung — 数据库 🚨",
        "questions": {"部门": {"type": "choice", "criteria": {"网络": "x", "b": "y"}}},
    },
]


@pytest.fixture(scope="module")
def engine(tiny_release: Path) -> Engine:
    return Engine.from_release(tiny_release, config=EngineConfig(device="cpu", dtype="float32"))


def check_invariants(body: dict[str, Any], response: SystemOneResponse, engine: Engine) -> None:
    request = SystemOneRequest.model_validate(body)
    assert response.model == request.model
    assert list(response.answers) == list(request.questions)
    assert response.usage.input_tokens == encode_request(request, engine.tokenizer).num_tokens
    assert response.usage.output_tokens == 0
    for qid, answer in response.answers.items():
        question = request.questions[qid]
        assert answer.type == question.type
        if isinstance(answer, NoulAnswer):
            assert 0.0 <= answer.noul <= 1.0
            continue
        probs = answer.probabilities
        assert all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in probs.values())
        assert abs(sum(probs.values()) - 1.0) <= 1e-4
        assert 0.0 <= answer.confidence <= 1.0
        if isinstance(answer, ChoiceAnswer):
            assert isinstance(question, ChoiceQuestion)
            assert list(probs) == list(question.criteria)  # request order, exactly the option ids
            assert probs[answer.choice] == max(probs.values())
        else:
            assert isinstance(answer, ScoreAnswer)
            assert isinstance(question, ScoreQuestion)
            assert list(probs) == [str(i) for i in range(len(question.criteria))]
            assert abs(answer.score - sum(i * probs[str(i)] for i in range(len(probs)))) <= 1e-4
            assert list(answer.legend) == list(probs)


def test_decide_keeps_order_and_isolates_bad_requests(engine: Engine) -> None:
    inputs: list[Any] = [
        VALID[0],
        b"{not json",
        VALID[1],
        {"state": "x"},  # no questions: schema violation
        json.dumps(VALID[2]),
        {"state": "x", "questions": {"q": NOUL}, "images": ["definitely-not-an-image"]},
        SystemOneRequest.model_validate(VALID[3]),
    ]
    results = engine.decide(inputs)
    assert len(results) == len(inputs)
    for k in (0, 2, 4, 6):
        assert isinstance(results[k], SystemOneResponse)
    for body, k in zip(VALID, (0, 2, 4, 6), strict=True):
        result = results[k]
        assert isinstance(result, SystemOneResponse)
        check_invariants(body, result, engine)
    bad_json, missing, media = results[1], results[3], results[5]
    assert isinstance(bad_json, RequestError)
    assert bad_json.reason is DlqReason.bad_json
    assert bad_json.status == 400
    assert isinstance(missing, RequestError)
    assert missing.status == 422
    assert isinstance(missing.body()["detail"], list)
    assert isinstance(media, RequestError)
    assert media.reason.value.startswith("media_")
    assert media.status < 500


def test_batching_does_not_change_answers(tiny_release: Path, engine: Engine) -> None:
    together = engine.decide(VALID)
    config = EngineConfig(device="cpu", dtype="float32", limits=BatchLimits(max_tokens=65_536, max_records=1))
    small = Engine(engine.model, engine.tokenizer, config)
    alone = small.decide(VALID)
    for a, b in zip(together, alone, strict=True):
        assert isinstance(a, SystemOneResponse)
        assert isinstance(b, SystemOneResponse)
        for qid, answer in a.answers.items():
            other = b.answers[qid]
            if isinstance(answer, NoulAnswer):
                assert isinstance(other, NoulAnswer)
                assert abs(answer.noul - other.noul) <= 1e-4
            else:
                assert not isinstance(other, NoulAnswer)
                for key, p in answer.probabilities.items():
                    assert abs(p - other.probabilities[key]) <= 1e-4


def test_overlong_state_is_truncated_or_rejected(engine: Engine) -> None:
    body = {"state": "word " * 3000, "questions": {"outage": NOUL}}
    full = encode_request(SystemOneRequest.model_validate(body), engine.tokenizer).num_tokens
    limit = full - 100
    cut = Engine(
        engine.model, engine.tokenizer, EngineConfig(device="cpu", dtype="float32", max_tokens=limit)
    )
    [response] = cut.decide([body])
    assert isinstance(response, SystemOneResponse)
    assert response.x_state_truncated is True
    assert response.usage.input_tokens == limit
    assert json.loads(response.model_dump_json())["x_state_truncated"] is True
    strict = Engine(
        engine.model,
        engine.tokenizer,
        EngineConfig(device="cpu", dtype="float32", max_tokens=limit, truncate_state=False),
    )
    [error] = strict.decide([body])
    assert isinstance(error, RequestError)
    assert error.reason is DlqReason.context_length_exceeded
    assert error.body() == {"detail": {"error_type": "context_length_exceeded", "message": error.message}}
    [ok] = engine.decide([body])
    assert isinstance(ok, SystemOneResponse)
    assert "x_state_truncated" not in json.loads(ok.model_dump_json())


def test_systemone_single_request_api(tiny_release: Path, engine: Engine) -> None:
    loaded = load_release_model(tiny_release, device="cpu", dtype=engine.config.torch_dtype)
    [expected] = engine.decide([VALID[2]])
    assert isinstance(expected, SystemOneResponse)
    for model in (loaded, loaded.model):
        for request in (VALID[2], json.dumps(VALID[2]), SystemOneRequest.model_validate(VALID[2])):
            response = systemone(model, loaded.tokenizer, request)
            check_invariants(VALID[2], response, engine)
            assert response == expected
    top = systemone(loaded, loaded.tokenizer, VALID[0], confidence_formula="top")
    answer = top.answers["department"]
    assert isinstance(answer, ChoiceAnswer)
    assert answer.confidence == max(answer.probabilities.values())
    with pytest.raises(RequestError) as info:
        systemone(loaded, loaded.tokenizer, {"state": 3, "questions": {"q": NOUL}})
    assert info.value.status == 422


def test_staged_execution_across_threads_equals_execute(engine: Engine) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from schemas.systemone import parse_request

    prepared = [engine.prepare(parse_request(body)) for body in VALID]
    direct = engine.execute(prepared)
    with ThreadPoolExecutor(1) as stager, ThreadPoolExecutor(1) as gpu, ThreadPoolExecutor(1) as answers:
        staged = stager.submit(engine.stage, prepared).result()
        # CPU sdpa packs nothing: one record per pass, so no dense attention mask (see test_text_cpu_memory)
        assert [group for group, _ in staged.parts] == [(i,) for i in range(len(prepared))]
        result = gpu.submit(engine.run, staged).result()
        split = answers.submit(engine.respond, result).result()
    assert [r.model_dump() for r in split] == [r.model_dump() for r in direct]
    with pytest.raises(ValueError, match="at least one record"):
        engine.stage([])


def test_padded_groups_are_cut_to_the_token_budget(tiny_release: Path) -> None:
    """The service's batcher budgets the plain sum of tokens; a right-padded batch costs records x longest,
    so `stage` cuts it into parts that fit `limits.max_tokens`, and the answers stay those of each record."""
    from schemas.systemone import parse_request

    budget = 700
    padded = Engine.from_release(
        tiny_release,
        config=EngineConfig(device="cpu", dtype="float32", layout="padded", limits=BatchLimits(budget, 64)),
    )
    prepared = [padded.prepare(parse_request(body)) for body in VALID * 2]
    lengths = [p.num_tokens for p in prepared]
    assert max(lengths) * len(lengths) > budget
    staged = padded.stage(prepared)
    groups = [group for group, _ in staged.parts]
    assert sorted(i for group in groups for i in group) == list(range(len(prepared)))
    assert len(groups) > 1
    for group in groups:
        assert list(group) == sorted(group)
        assert len(group) == 1 or len(group) * max(lengths[i] for i in group) <= budget
    together = padded.respond(padded.run(staged))
    for p, response in zip(prepared, together, strict=True):
        (alone,) = padded.execute([p])
        for qid, answer in response.answers.items():
            expected = alone.answers[qid].model_dump()
            for key, value in answer.model_dump().items():
                if isinstance(value, float):
                    assert value == pytest.approx(expected[key], abs=1e-3)
