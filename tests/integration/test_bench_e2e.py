"""`python3 -m bench.e2e` runs end to end: with the stub engine its own broker, the service, the producer,
the tail consumer and the lag sampler; `--mixed` with the tiny release on CPU (slow enough to queue) two
input topics and the HTTP API beside them (tiny runs: these check that every event and request is answered
and reported, once, with the offsets committed to the end, not any speed)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

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


def test_e2e_shares_run_each_load_at_its_share_of_the_capacity_measured_first(tmp_path: Path) -> None:
    args = ["--engine", "tiny", "--shares", "--rate", "0.5", "--capacity-events", "32", "--seconds", "2"]
    assert main([*args, "--warmup-s", "1", "--pool", "16", "--drain-s", "40", "--out", str(tmp_path)]) == 0
    lines: list[dict[str, Any]] = [json.loads(ln) for ln in (tmp_path / "e2e.jsonl").read_text().splitlines()]
    (info,) = [line for line in lines if line["kind"] == "info"]
    assert (info["rates"], info["rates_are_shares"]) == ([0.5], True)
    (capacity,) = [line for line in lines if line["kind"] == "capacity"]
    (load,) = [line for line in lines if line["kind"] == "load"]
    assert load["rate"] == round(0.5 * capacity["events_s"], 2)
    assert (load["decided"], load["undecided"], load["dead_lettered"]) == (load["events"], 0, 0)


def test_e2e_shares_without_a_capacity_figure_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--shares needs"):
        main(["--engine", "stub", "--shares", "--rate", "0.5", "--out", str(tmp_path)])


@pytest.mark.parametrize("engine_fp8", [("stub", "text"), ("tiny", "text"), ("full", "off")])
def test_e2e_sm90_without_the_full_fp8_engine_is_refused(tmp_path: Path, engine_fp8: tuple[str, str]) -> None:
    engine, fp8 = engine_fp8
    with pytest.raises(SystemExit, match="--sm90 needs"):
        main(["--engine", engine, "--fp8", fp8, "--sm90", "--rate", "1", "--out", str(tmp_path)])


def test_e2e_mixed_tiny_run_answers_every_class_once(tmp_path: Path) -> None:
    args = ["--mixed", "--engine", "tiny", "--capacity-events", "64", "--backlog-s", "2", "--seconds", "4"]
    began = time.monotonic()
    assert main([*args, "--pool", "16", "--drain-s", "40", "--out", str(tmp_path)]) == 0
    assert time.monotonic() - began < 90
    lines: list[dict[str, Any]] = [json.loads(ln) for ln in (tmp_path / "e2e.jsonl").read_text().splitlines()]
    kinds = [line["kind"] for line in lines]
    assert {"info", "capacity", "backlog", "mixed", "ledger", "done"} <= set(kinds)
    assert not {"load", "warmup"} & set(kinds)
    (capacity,) = [line for line in lines if line["kind"] == "capacity"]
    (mixed,) = [line for line in lines if line["kind"] == "mixed"]
    assert mixed["backlog_events"] == round(2 * capacity["events_s"])  # 2 s of engine-only work
    assert mixed["bulk_rate"] == round(1.2 * capacity["events_s"], 2)
    classes = mixed["classes"]
    assert set(classes) == {"backlog", "bulk", "critical", "http"}
    for name, c in classes.items():
        assert c["sent"] > 0, name
        assert c["answered"] == c["sent"], name
        assert 0 < c["p50_ms"] <= c["p95_ms"] <= c["p99_ms"] <= c["max_ms"], name
    assert classes["backlog"]["sent"] == mixed["backlog_events"]
    assert (classes["http"]["errors"], classes["http"]["unanswered"]) == (0, 0)
    topics = mixed["topics"]
    assert topics["alerts.in"]["sent"] == classes["backlog"]["sent"] + classes["bulk"]["sent"]
    assert topics["alerts.critical"]["sent"] == classes["critical"]["sent"]
    for topic in topics.values():
        assert (topic["decided"], topic["duplicates"], topic["lost"]) == (topic["sent"], 0, 0)
    offsets = mixed["offsets"]
    assert {(o["topic"], o["partition"]) for o in offsets} == {
        (t, p) for t in ("alerts.in", "alerts.critical") for p in range(3)
    }
    assert mixed["offsets_at_end"]
    assert all(o["committed"] == o["high"] for o in offsets)
    assert sum(o["high"] for o in offsets) == sum(t["sent"] for t in topics.values())
    assert mixed["kafka_out_s"] > 0
    assert mixed["kafka_out_over_engine_only"] is not None
    (ledger,) = [line for line in lines if line["kind"] == "ledger"]
    assert ledger["sent"] == ledger["decided"] == sum(t["sent"] for t in topics.values())
    assert (ledger["duplicates"], ledger["unknown"], ledger["send_errors"]) == (0, 0, 0)
    text = (tmp_path / "e2e.txt").read_text()
    assert all(f"| {name} |" in text for name in [*classes, "alerts.in", "alerts.critical"])
