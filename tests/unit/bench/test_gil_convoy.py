"""`bench.gil_convoy`'s rows and arguments (its timings are the bench's business, not a test's)."""

from __future__ import annotations

import json
import sys

import pytest

from bench import gil_convoy


def test_one_row_per_competitor_and_interval_and_the_interval_is_restored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = sys.getswitchinterval()
    assert (
        gil_convoy.main(
            ["--ops", "5", "--reps", "3", "--switch-ms", "5,1", "--burst-ms", "1", "--gap-ms", "1"]
        )
        == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["competitor"], r["switch_ms"]) for r in rows] == [
        ("none", 5.0),
        ("bursts", 5.0),
        ("bursts", 1.0),
        ("busy", 5.0),
        ("busy", 1.0),
    ]
    assert all(0 <= r["p50_ms"] <= r["p90_ms"] <= r["max_ms"] and r["ops"] == 5 for r in rows)
    assert sys.getswitchinterval() == before


def test_an_unknown_competitor_is_refused() -> None:
    with pytest.raises(SystemExit):
        gil_convoy.main(["--competitors", "none,loud"])
