"""`bench.targets`: the done-when table read from a `scripts/device-targets.sh` folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bench.targets import Verdict, report, verdicts

ROOT = Path(__file__).resolve().parents[3]
RAW = ROOT / "docs" / "bench"


def _write(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")


_STEP_FILES = {
    "e2e": "e2e.jsonl",
    "mixed": "e2e.jsonl",
    "one_fp8": "one_request.jsonl",
    "one_bf16": "one_request.jsonl",
    "modes": "fp8_modes.jsonl",
}
"""The file each step of `scripts/device-targets.sh` leaves in its folder."""


def _lay_out(folder: Path, **raw: str) -> None:
    """Raw files of `docs/bench` copied into `folder` as the script lays them out (step = raw file name)."""
    for step, name in raw.items():
        (folder / step).mkdir()
        shutil.copy(RAW / name, folder / step / _STEP_FILES[step])


def _by_target(found: list[Verdict]) -> dict[str, Verdict]:
    return {v.target: v for v in found}


def test_a_folder_without_steps_reads_not_run(tmp_path: Path) -> None:
    found = verdicts(tmp_path)
    assert len(found) == 13
    assert all(v.value is None and v.met is None and v.status() == "not run" for v in found)
    assert "| p99 at 70% load (ms) | <= 150 | not run | not run |" in report(tmp_path)


def test_loads_are_matched_to_their_share_of_the_capacity_and_the_worst_counts(tmp_path: Path) -> None:
    _write(
        tmp_path / "e2e" / "e2e.jsonl",
        [
            {"kind": "info", "device": "NVIDIA H200"},
            {"kind": "capacity", "events_s": 100.0},
            {"kind": "load", "rate": 25.0, "p50_ms": 40.0, "p99_ms": 90.0},
            {"kind": "load", "rate": 70.0, "p50_ms": 80.0, "p99_ms": 149.0},
            {"kind": "load", "rate": 71.5, "p50_ms": 82.0, "p99_ms": 151.0},  # 0.715: still 70%
            {"kind": "load", "rate": 90.0, "p50_ms": 120.0, "p99_ms": 400.0},  # no target's share
        ],
    )
    found = _by_target(verdicts(tmp_path))
    p99 = found["p99 at 70% load (ms)"]
    assert (p99.value, p99.met, p99.source) == (151.0, False, "e2e, 2 load(s)")
    p50 = found["p50 at 25% load (ms)"]
    assert (p50.value, p50.met) == (40.0, True)
    assert "on NVIDIA H200" in report(tmp_path)
    assert found["capacity through Kafka / engine-only"].status() == "not run"  # no load above capacity


def test_capacity_through_kafka_is_the_worst_saturated_loads_out_over_engine_only(tmp_path: Path) -> None:
    _write(
        tmp_path / "e2e" / "e2e.jsonl",
        [
            {"kind": "capacity", "events_s": 100.0},
            {"kind": "load", "rate": 70.0, "events_out_s": 70.0, "p99_ms": 140.0},  # not saturated
            {"kind": "load", "rate": 101.0, "events_out_s": 60.0},  # 1.01: not saturated enough to count
            {"kind": "load", "rate": 120.0, "events_out_s": 99.0},
            {"kind": "load", "rate": 120.0, "events_out_s": 97.5},
        ],
    )
    found = _by_target(verdicts(tmp_path))
    through = found["capacity through Kafka / engine-only"]
    assert (through.value, through.met, through.source) == (0.975, False, "e2e, 2 saturated load(s)")
    card: dict[str, object] = {"kind": "request", "device": "NVIDIA H100 80GB HBM3"}
    _write(tmp_path / "one_fp8" / "one_request.jsonl", [card])
    assert "targets of issues 29 and 30 on NVIDIA H100 80GB HBM3 (" in report(tmp_path)


def test_the_saturated_run_counts_lost_and_duplicated_events_over_every_topic(tmp_path: Path) -> None:
    topics = {"alerts.in": {"lost": 0, "duplicates": 1}, "alerts.critical": {"lost": 2, "duplicates": 0}}
    mixed = {
        "kind": "mixed",
        "classes": {"http": {"p99_ms": 301.0}, "critical": {"p99_ms": 99.0}},
        "topics": topics,
        "kafka_out_over_engine_only": 0.95,
        "offsets_at_end": False,
    }
    _write(tmp_path / "mixed" / "e2e.jsonl", [mixed])
    found = _by_target(verdicts(tmp_path))
    assert found["saturated: HTTP p99 (ms)"].met is False
    assert found["saturated: priority topic p99 (ms)"].met is True
    assert found["saturated: Kafka out / engine-only"].met is True
    lost = found["saturated: events lost or duplicated"]
    assert (lost.value, lost.met) == (3.0, False)
    assert found["saturated: offsets at the high watermarks (1 yes)"].met is False


def test_throughput_takes_the_best_text_only_mode_and_one_request_its_first_decide(tmp_path: Path) -> None:
    modes = [
        {"kind": "mode", "mode": "bf16", "tok_s": 92_500, "serving_peak_gb": 72.9},
        {"kind": "mode", "mode": "fp8_text_only_attention", "tok_s": 123_000, "serving_peak_gb": 44.4},
        {"kind": "mode", "mode": "fp8_text_only_attention_sm90", "tok_s": 127_000, "serving_peak_gb": 76.0},
        {"kind": "mode", "mode": "fp8_triton_attention", "tok_s": 130_000, "serving_peak_gb": 102.0},
    ]
    _write(tmp_path / "modes" / "fp8_modes.jsonl", modes)
    decide = [
        {"kind": "stage", "stage": "run", "ms_p50": 10.0},
        {"kind": "stage", "stage": "decide", "ms_p50": 11.5},
        {"kind": "stage", "stage": "decide", "ms_p50": 20.0},  # a later request (--sm90, more records)
    ]
    _write(tmp_path / "one_fp8" / "one_request.jsonl", decide)
    found = _by_target(verdicts(tmp_path))
    fp8 = found["throughput FP8, budget 65,536 (tok/s)"]
    assert (fp8.value, fp8.met, fp8.source) == (127_000.0, True, "fp8_modes fp8_text_only_attention_sm90")
    peak = found["FP8 text-only serving peak (GB)"]
    assert (peak.value, peak.met) == (76.0, False)  # the peak of the mode whose throughput is quoted
    assert found["throughput bf16, budget 65,536 (tok/s)"].met is True
    one = found["one 800-token request, FP8 text (ms)"]
    assert (one.value, one.met) == (11.5, True)
    assert found["one 800-token request, bf16 (ms)"].status() == "not run"


def test_round_tens_h200_files_give_round_tens_table(tmp_path: Path) -> None:
    # the raw files of BENCHMARKS.md "Priority classes, round ten" laid out as the script lays them out
    _lay_out(
        tmp_path,
        e2e="e2e_levelled_round14_h200_shares.jsonl",
        mixed="e2e_mixed_round14_h200.jsonl",
        one_fp8="one_request_round14_h200_fp8text.jsonl",
        one_bf16="one_request_round14_h200_bf16.jsonl",
        modes="fp8_modes_round14_h200.jsonl",
    )
    found = _by_target(verdicts(tmp_path))
    assert {t: (v.value, v.met) for t, v in found.items()} == {
        "p99 at 70% load (ms)": (182.11, False),
        "p50 at 25% load (ms)": (32.33, True),
        "capacity through Kafka / engine-only": (None, None),  # round ten ran no load above capacity
        "saturated: HTTP p99 (ms)": (131.09, True),
        "saturated: priority topic p99 (ms)": (93.87, True),
        "saturated: Kafka out / engine-only": (0.942, True),
        "saturated: events lost or duplicated": (0.0, True),
        "saturated: offsets at the high watermarks (1 yes)": (1.0, True),
        "one 800-token request, FP8 text (ms)": (15.8, False),
        "one 800-token request, bf16 (ms)": (24.05, False),
        "throughput FP8, budget 65,536 (tok/s)": (123_571.0, False),
        "throughput bf16, budget 65,536 (tok/s)": (85_223.0, False),
        "FP8 text-only serving peak (GB)": (44.43, True),
    }
    assert "targets of issues 29 and 30 on NVIDIA H200" in report(tmp_path)


def test_round_twenty_twos_h200_files_give_its_printed_table(tmp_path: Path) -> None:
    # the three device calls of BENCHMARKS.md "Targets, round twenty-two" (`device-targets.sh one e2e`, then
    # `modes`, then `mixed`), their folders unpacked into one as the section says: every row read
    _lay_out(
        tmp_path,
        e2e="e2e_round28_h200_shares.jsonl",
        mixed="e2e_round28_h200_mixed.jsonl",
        one_fp8="one_request_round28_h200_fp8text.jsonl",
        one_bf16="one_request_round28_h200_bf16.jsonl",
        modes="fp8_modes_round28_h200.jsonl",
    )
    found = _by_target(verdicts(tmp_path))
    assert {t: (v.value, v.met) for t, v in found.items()} == {
        "p99 at 70% load (ms)": (186.18, False),
        "p50 at 25% load (ms)": (35.09, True),
        "capacity through Kafka / engine-only": (1.009, True),
        "saturated: HTTP p99 (ms)": (177.93, True),
        "saturated: priority topic p99 (ms)": (186.73, True),
        "saturated: Kafka out / engine-only": (0.919, True),
        "saturated: events lost or duplicated": (0.0, True),
        "saturated: offsets at the high watermarks (1 yes)": (1.0, True),
        "one 800-token request, FP8 text (ms)": (16.5, False),
        "one 800-token request, bf16 (ms)": (24.35, False),
        "throughput FP8, budget 65,536 (tok/s)": (126_756.0, True),  # the opt-in sm90 kernels' mode
        "throughput bf16, budget 65,536 (tok/s)": (85_731.0, False),
        "FP8 text-only serving peak (GB)": (44.4, True),
    }
    assert found["throughput FP8, budget 65,536 (tok/s)"].source == "fp8_modes fp8_text_only_attention_sm90"
