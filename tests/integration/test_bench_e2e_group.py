"""`python3 -m bench.e2e_group` runs end to end with the stub engine: its own broker, service child processes
in one consumer group, the producer and the tail consumer. The fault run kills one child with SIGKILL in the
middle of the stream, in at-least-once and exactly-once mode; every event must still be decided (and, in
exactly-once mode, once), the survivor must take the orphaned partitions and the restarted child must come
back. Tiny runs: they check the ledger and that the timings are measured, not any speed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.e2e_group import main

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (out / "group.jsonl").read_text().splitlines()]


def test_fault_run_loses_nothing_in_both_modes(tmp_path: Path) -> None:
    args = ["--scenario", "fault", "--engine", "stub", "--processes", "2", "--rate", "20", "--seconds", "20"]
    args += ["--kill-at-s", "4", "--restart-after-s", "1", "--session-timeout-ms", "6000", "--pool", "16"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    lines = _lines(tmp_path)
    faults = {line["mode"]: line for line in lines if line["kind"] == "fault"}
    assert set(faults) == {"alo", "eos"}
    for mode, f in faults.items():
        assert f["sent"] > 200, mode
        assert f["lost"] == 0, mode
        assert f["decided"] + f["dead_lettered"] == f["sent"], mode
        assert f["send_errors"] == 0, mode
        assert len(f["orphaned_partitions"]) == 6, mode
        assert f["orphaned_events_after_kill"] > 0, mode
        # the coordinator waits for the dead member's session to expire before it hands its partitions on
        assert f["survivor_assigned_s"] is not None, mode
        assert f["survivor_assigned_s"] >= 5.0, mode
        assert f["orphaned_first_decision_s"] is not None, mode
        assert f["orphaned_first_decision_s"] >= f["survivor_assigned_s"] - 0.5, mode
        assert 0 < f["restart_ready_s"] < 120, mode
        assert f["restart_assigned_s"] is not None, mode
        assert f["restart_partitions"], mode
        assert f["restart_first_decision_s"] is not None, mode
    assert faults["eos"]["duplicates"] == 0
    killed = [line for line in lines if line["kind"] == "killed"]
    assert [k["mode"] for k in killed] == ["alo", "eos"]
    text = (tmp_path / "group.txt").read_text()
    assert "fault (at-least-once)" in text
    assert "fault (exactly-once)" in text
    assert "pid" in (tmp_path / "children.log").read_text()


def test_steady_run_with_two_processes_decides_every_event(tmp_path: Path) -> None:
    args = ["--engine", "stub", "--processes", "2", "--rate", "0.1,0.2", "--shares", "--seconds", "3"]
    args += ["--warmup-s", "1", "--pool", "16", "--capacity-events", "300", "--out", str(tmp_path)]
    assert main(args) == 0
    (capacity,) = [line for line in _lines(tmp_path) if line["kind"] == "capacity"]
    assert (capacity["events"], capacity["decided"], capacity["dead_lettered"]) == (300, 300, 0)
    assert capacity["seconds"] > 0
    # "seconds" is printed to 0.01 s: the rate is 300 over the unrounded time, within that rounding
    low, high = capacity["seconds"] - 0.005, capacity["seconds"] + 0.005
    assert 300 / high <= capacity["events_s"] <= 300 / max(low, 1e-3)
    assert "capacity through Kafka (2 process(es))" in (tmp_path / "group.txt").read_text()
    loads = [line for line in _lines(tmp_path) if line["kind"] == "load"]
    assert [line["share"] for line in loads] == [0.1, 0.2]
    assert [line["rate"] for line in loads] == [round(s * capacity["events_s"], 2) for s in (0.1, 0.2)]
    for line in loads:
        assert line["events"] > 0
        assert (line["decided"], line["undecided"]) == (line["events"], 0)
        assert 0 < line["p50_ms"] <= line["p99_ms"]
        assert len(line["service"]) == 2  # each child's /metrics, read around the window
        assert sum(c["records"] for c in line["service"]) == line["events"]
    (settled,) = [line for line in _lines(tmp_path) if line["kind"] == "group_settled"]
    assert settled["processes"] == 2


def test_shares_need_a_capacity_run() -> None:
    with pytest.raises(SystemExit, match="--shares needs"):
        main(["--rate", "0.5", "--shares"])
