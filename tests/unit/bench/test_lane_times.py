"""bench.lane_times: the urgent batches' lane times out of a JSON service log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.lane_times import lane_rows, main, summary


def _batch(urgent: bool, run_ms: float, inside: bool = True) -> str:
    line: dict[str, object] = {"event": "batch", "urgent": urgent, "records": 1, "engine_ms": run_ms}
    if urgent:
        line |= {"stage_ms": 2.0, "lane_wait_ms": 1.0, "run_ms": run_ms, "settle_ms": 0.5}
        line |= {"respond_ms": 0.25, "inside": inside}
    return json.dumps(line)


def test_only_urgent_batch_lines_with_lane_times_count() -> None:
    lines = [
        _batch(True, 30.0),
        _batch(False, 500.0),  # a bulk batch
        "not json {",
        json.dumps({"event": "batch", "urgent": True, "engine_ms": 9.0}),  # a split one: no lane times
        json.dumps({"event": "fetch", "urgent": True, "run_ms": 1.0}),
        _batch(True, 10.0, inside=False),
    ]
    rows = lane_rows(lines)
    assert [r["run_ms"] for r in rows] == [30.0, 10.0]
    got = summary(rows)
    assert got["urgent_batches"] == 2
    assert got["inside"] == 1
    assert got["run_ms"] == {"p50_ms": 30.0, "p95_ms": 30.0, "p99_ms": 30.0, "max_ms": 30.0}
    assert got["stage_ms"]["max_ms"] == 2.0


def test_main_prints_one_line_per_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "stderr.log"
    log.write_text("\n".join([_batch(True, 12.0), _batch(True, 20.0)]) + "\n")
    assert main([str(log)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["log"] == str(log)
    assert out["urgent_batches"] == 2
    assert out["run_ms"]["p50_ms"] == 20.0
    assert main([]) == 2
