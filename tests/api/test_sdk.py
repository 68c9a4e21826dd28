"""The official `typesafe-sdk` (PyPI) as a client of `clef-router serve` on the tiny release: it parses every
answer type and `models.list()`, and raises its own error classes for 401, 404, 422 and other 4xx."""

from __future__ import annotations

import json
import math
import urllib.request
from collections.abc import Callable

import pytest
from typesafe_sdk import (
    Choice,
    Noul,
    NoulCriteria,
    RetryPolicy,
    Score,
    SystemOneResponse,
    TypeSafeAPIError,
    TypeSafeAuthenticationError,
    TypeSafeBadRequestError,
    TypeSafeClient,
    TypeSafeNotFoundError,
    TypeSafeUnprocessableEntityError,
)

Served = Callable[..., str]

pytestmark = pytest.mark.slow
KEY = "sdk-test-key"
NO_RETRY = RetryPolicy(max_retries=0)


def sdk(url: str, key: str = "any-key") -> TypeSafeClient:
    # the SDK's default compression: bodies of 1 KiB and more go out as zstd (backports.zstd is installed)
    return TypeSafeClient(api_key=key, base_url=url, timeout=60, retry=NO_RETRY)


def test_sdk_parses_every_answer_type(served: Served) -> None:
    questions = {
        "outage": Noul(instructions="Is a customer-facing service down?"),
        "one_sided": Noul(criteria=NoulCriteria(true="The disk is full")),
        "team": Choice(
            instructions="Which team?",
            criteria={"Storage": "Disks and volumes", "Network": None, "DB": {"owns": ["replication"]}},
        ),
        "urgency": Score(instructions="How urgent?", criteria=["low", "medium", "high", "critical"]),
        "structured": Score(criteria=[{"label": "calm"}, ["angry", "very"]]),
    }
    with sdk(served()) as client:
        state = {"host": "db-1", "summary": "disk full", "log": ["write failed: no space left"] * 40}
        r = client.system_one(state=state, questions=questions)
    assert r.model == "jev-latest"  # the SDK's default model, accepted as an alias and echoed
    assert set(r.nouls) == {"outage", "one_sided"}
    assert all(0 <= a.noul <= 1 for a in r.nouls.values())
    team = r.choices["team"]
    assert list(team.probabilities) == ["Storage", "Network", "DB"]
    assert team.choice in team.probabilities
    assert math.isclose(sum(team.probabilities.values()), 1, abs_tol=1e-3)
    urgency = r.scores["urgency"]
    assert list(urgency.legend) == [0, 1, 2, 3]
    assert urgency.legend[2] == "high"
    assert math.isclose(urgency.score, sum(i * p for i, p in urgency.probabilities.items()), abs_tol=1e-3)
    assert 0 <= urgency.confidence <= 1
    assert list(r.scores["structured"].probabilities) == [0, 1]
    assert r.usage.input_tokens is not None
    assert r.usage.input_tokens > 0


def test_sdk_parses_a_null_score_level(served: Served) -> None:
    """The SDK cannot send a null level (its criteria type has no null) but other clients can; the answer's
    legend holds `""` for it (SPEC 2), which the SDK's own response model accepts."""
    question = {"type": "score", "criteria": ["low", None, "high"]}
    body = json.dumps({"state": "disk full", "questions": {"urgency": question}}).encode()
    request = urllib.request.Request(
        served() + "/v1/systemone", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answered:
        raw = answered.read()
    assert json.loads(raw)["answers"]["urgency"]["legend"] == {"0": "low", "1": "", "2": "high"}
    parsed = SystemOneResponse.model_validate_json(raw)  # what the SDK's client does with a 200 body
    assert parsed.scores["urgency"].legend == {0: "low", 1: "", 2: "high"}


def test_sdk_lists_models(served: Served) -> None:
    with sdk(served()) as client:
        models = client.models.list().models
    names = [m.name for m in models]
    assert names == ["clef-omni", "jev-latest"]
    assert models[0].release_date == "2026-12-01"


def test_sdk_error_classes(served: Served) -> None:
    url = served()
    noul = {"q": Noul(instructions="Is it down?")}
    locked = served(api_key=KEY)
    with sdk(locked, key="wrong-key") as client, pytest.raises(TypeSafeAuthenticationError) as auth:
        client.system_one(state="x", questions=noul)
    assert "invalid API key" in str(auth.value)
    assert auth.value.request_id
    with sdk(url + "/no/such/prefix") as client, pytest.raises(TypeSafeNotFoundError):
        client.system_one(state="x", questions=noul)
    with sdk(url) as client:
        with pytest.raises(TypeSafeNotFoundError) as model:
            client.system_one(state="x", questions=noul, model="no-such-model")
        assert model.value.body["detail"]["error_type"] == "model_not_found"
        with pytest.raises(TypeSafeUnprocessableEntityError) as invalid:
            client.system_one(state="x", questions=noul, extra_body={"questions": {}})
        assert invalid.value.body["detail"][0]["loc"] == ["body", "questions"]
        with pytest.raises(TypeSafeBadRequestError) as refused:
            client.system_one(state="x", questions=noul, extra_body={"images": ["https://example.com/a.png"]})
        assert refused.value.body["detail"]["error_type"] == "media_forbidden_url"
    with sdk(locked, key=KEY) as client:
        assert client.system_one(state="x", questions=noul).nouls["q"].type == "noul"
    assert issubclass(TypeSafeAuthenticationError, TypeSafeAPIError)
