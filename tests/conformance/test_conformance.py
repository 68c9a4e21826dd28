"""Every fixture case through the engine on CPU in float32, against the vendor's reference runtime.

Per case (README.md in this directory): the exact input_ids, each raw option probability within 2e-4, a
refusal (a client error with a message) where the reference refuses, and the response fields the README lists.
The per-case max |dp| table is printed in pytest's terminal summary (`conftest.py`); set
CLEF_CONFORMANCE_REPORT=path to also write it as JSON. Runs under every supported transformers version.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conformance_support import RELEASE, Case, Outcome, load_cases, run_case

from engine.release import load_release_model
from engine.runner import Engine

CASES = load_cases()
OUTCOMES: dict[str, Outcome] = {}
"""Filled as the cases run; read by conftest.py's terminal summary."""


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.from_release(RELEASE, device="cpu", dtype="float32")


def test_fixture_is_complete() -> None:
    assert len(CASES) == 43
    assert sum(c.refused for c in CASES) == 3
    assert {p.name for p in RELEASE.iterdir()} >= {"config.json", "joint_head.safetensors", "tokenizer.json"}
    index = json.loads((RELEASE / "model.safetensors.index.json").read_text(encoding="utf-8"))
    assert len(index["weight_map"]) == 109 + 197  # thinker, then talker + code2wav


def test_fixture_release_loads_strictly() -> None:
    loaded = load_release_model(RELEASE, device="cpu", dtype=torch.float32, load_processor=False)
    assert loaded.model.head.config.width == 32


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(engine: Engine, case: Case) -> None:
    try:
        outcome = run_case(engine, case)
    except Exception as exc:  # recorded for the table, then reported by pytest as it is
        OUTCOMES[case.name] = Outcome(case.name, problems=[f"crashed: {type(exc).__name__}: {exc}"])
        raise
    OUTCOMES[case.name] = outcome
    assert not outcome.problems, f"{case.name}:\n  " + "\n  ".join(outcome.problems)


def write_report(path: Path) -> None:
    """Write the collected outcomes as JSON (called by conftest.py when CLEF_CONFORMANCE_REPORT is set)."""
    from conformance_support import as_json

    path.write_text(json.dumps(as_json(OUTCOMES.values()), indent=1) + "\n", encoding="utf-8")
