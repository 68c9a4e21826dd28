"""`python3 -m bench.e2e` runs end to end with the stub engine: its own broker, the service, the producer,
the tail consumer and the lag sampler (a tiny run: this checks that every event is decided and reported,
not any speed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.e2e import main

pytestmark = pytest.mark.kafka


def test_e2e_stub_run_decides_every_event(tmp_path: Path) -> None:
    args = ["--engine", "stub", "--rate", "20", "--seconds", "3", "--warmup-s", "1", "--pool", "16"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    lines = [json.loads(ln) for ln in (tmp_path / "e2e.jsonl").read_text().splitlines()]
    kinds = {line["kind"] for line in lines}
    assert {"info", "warmup", "lag", "load", "ledger", "done"} <= kinds
    (load,) = [line for line in lines if line["kind"] == "load"]
    assert load["events"] == 60
    assert (load["decided"], load["undecided"], load["dead_lettered"]) == (60, 0, 0)
    assert 0 < load["p50_ms"] <= load["p99_ms"]
    (ledger,) = [line for line in lines if line["kind"] == "ledger"]
    assert ledger["sent"] == ledger["decided"] == 80
    assert (ledger["duplicates"], ledger["unknown"], ledger["send_errors"]) == (0, 0, 0)
    (done,) = [line for line in lines if line["kind"] == "done"]
    assert done["broker_missing_class_lines"] == []
    assert "| 20 |" in (tmp_path / "e2e.txt").read_text()
    assert (tmp_path / "broker.log").is_file()
