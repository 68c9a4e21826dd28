"""Every fixture case through the engine on CPU in float32, against the vendor's reference runtime, on both
of the fixture's release layouts (`release/` fused experts, `release-per-expert/` one tensor per expert).

Per case (README.md in this directory): the exact input_ids, each raw option probability within 2e-4, a
refusal (a client error with a message) where the reference refuses, and the response fields the README lists.
The per-case max |dp| table is printed in pytest's terminal summary (`conftest.py`); set
CLEF_CONFORMANCE_REPORT=path to also write it as JSON. Runs under every supported transformers version.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from conformance_support import FIXTURE, RELEASE, Case, Outcome, load_cases, run_case

from engine.model.release import load_release_model
from engine.runner import Engine

CASES = load_cases()
LAYOUTS = {"fused": RELEASE, "per-expert": FIXTURE / "release-per-expert"}
"""The same weights in the two expert layouts a release may use (README.md); the answers must not differ."""
OUTCOMES: dict[str, Outcome] = {}
"""Filled as the cases run, keyed `layout/case`; read by conftest.py's terminal summary."""


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def engine(layout: str) -> Engine:
    return Engine.from_release(LAYOUTS[layout], device="cpu", dtype="float32")


def test_fixture_is_complete() -> None:
    assert len(CASES) == 43
    assert sum(c.refused for c in CASES) == 3
    assert {p.name for p in RELEASE.iterdir()} >= {"config.json", "joint_head.safetensors", "tokenizer.json"}
    index = json.loads((RELEASE / "model.safetensors.index.json").read_text(encoding="utf-8"))
    assert len(index["weight_map"]) == 109 + 197  # thinker, then talker + code2wav


def test_per_expert_fixture_stores_every_expert_alone() -> None:
    index = json.loads((LAYOUTS["per-expert"] / "model.safetensors.index.json").read_text(encoding="utf-8"))
    names = index["weight_map"]
    assert not any(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k in names)
    assert "thinker.model.layers.1.mlp.experts.3.up_proj.weight" in names


def test_layouts_load_to_identical_parameters() -> None:
    fused, per_expert = (
        load_release_model(LAYOUTS[k], device="cpu", dtype=torch.float32, load_processor=False).model
        for k in ("fused", "per-expert")
    )
    assert fused.head.config.width == 32
    theirs = per_expert.thinker.state_dict()
    for key, value in fused.thinker.state_dict().items():
        assert torch.equal(value, theirs[key]), key


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(engine: Engine, layout: str, case: Case) -> None:
    key = f"{layout}/{case.name}"
    try:
        outcome = run_case(engine, case)
    except Exception as exc:  # recorded for the table, then reported by pytest as it is
        OUTCOMES[key] = Outcome(key, problems=[f"crashed: {type(exc).__name__}: {exc}"])
        raise
    OUTCOMES[key] = dataclasses.replace(outcome, name=key)
    assert not outcome.problems, f"{case.name}:\n  " + "\n  ".join(outcome.problems)


def write_report(path: Path) -> None:
    """Write the collected outcomes as JSON (called by conftest.py when CLEF_CONFORMANCE_REPORT is set)."""
    from conformance_support import as_json

    path.write_text(json.dumps(as_json(OUTCOMES.values()), indent=1) + "\n", encoding="utf-8")
