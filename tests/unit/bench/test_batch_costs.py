"""`bench.batch_costs`: which log lines count, and the two cost models on batches whose GPU time is a step
function of their tokens (a graph replay computes its whole bucket)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bench.batch_costs import batch_rows, batches, by_bucket, errors, main, next_stage, summary
from bench.batcher_model import PaddedCost, padded
from consumer.batching.adaptive import CostModel

BUCKETS = (1024, 1536, 2048, 2560, 3072, 3584, 4096)


def _line(tokens: int, run_ms: float, **extra: object) -> str:
    row = {"event": "batch", "urgent": False, "records": 4, "tokens": tokens, "splits": 0, "failed": 0}
    return json.dumps(row | {"run_ms": run_ms} | extra)


def _step_runs(n: int, buckets: tuple[int, ...] = BUCKETS) -> list[tuple[int, float]]:
    rng = random.Random(5)
    return [(t, 0.005 + 1e-5 * padded(t, buckets)) for t in (rng.randint(900, 4000) for _ in range(n))]


def test_only_normal_clean_batches_count() -> None:
    lines = [
        "gc_tuned frozen=1",  # not JSON
        json.dumps({"event": "partitions_assigned"}),
        _line(800, 12.5),
        _line(900, 13.0, urgent=True),
        _line(900, 13.0, splits=1),
        _line(900, 13.0, failed=2),
        json.dumps({"event": "batch", "urgent": False, "tokens": 5}),  # no steps: an old line
        _line(1600, 20.0),
    ]
    assert batches(lines) == [(800, 0.0125), (1600, 0.02)]
    assert batch_rows([_line(800, 12.5, stage_ms=3.5), _line(900, 13.0)]) == [
        (800, 0.0125, 3.5),
        (900, 0.013, 0.0),  # no stage_ms logged
    ]


def test_a_runs_residual_is_grouped_by_the_next_batchs_staging() -> None:
    """Every fourth batch runs 20 ms over its bucket's median and the batch after it took 12 ms to stage;
    the others stage in 3 ms and run at the median: the 10+ group holds the long runs, the correlation is
    high."""
    rows = []
    for i in range(40):
        long = i % 4 == 0
        rows.append((3000, 0.036 + (0.02 if long else 0.0), 0.0))
    rows = [(t, s, 12.0 if i > 0 and rows[i - 1][1] > 0.04 else 3.0) for i, (t, s, _) in enumerate(rows)]
    out = next_stage(rows, BUCKETS)
    groups = {r["stage_ms"]: r for r in out if r["kind"] == "next_stage"}
    assert set(groups) == {"2-4", "10-inf"}
    assert groups["10-inf"]["batches"] == 10
    assert groups["10-inf"]["residual_ms_mean"] == pytest.approx(20.0)
    assert groups["2-4"]["batches"] == 29  # the last batch has no next one
    assert groups["2-4"]["residual_ms_p50"] == pytest.approx(0.0)
    corr = out[-1]
    assert corr["kind"] == "next_stage_corr"
    assert corr["batches"] == 39
    assert isinstance(corr["correlation"], float)
    assert corr["correlation"] > 0.99
    flat = next_stage([(3000, 0.036, 3.0)] * 5, BUCKETS)
    assert flat[-1]["correlation"] is None  # no spread: no correlation


def test_padding_explains_a_step_cost_and_the_linear_error_follows_the_bucket() -> None:
    runs = _step_runs(300)
    linear = errors(runs, CostModel())
    padded_errs = errors(runs, PaddedCost(BUCKETS))
    assert len(linear) == len(padded_errs) == 298  # the first two only teach the fit
    lin, pad = summary("linear", linear), summary("padded", padded_errs)
    assert pad["abs_ms_mean"] == 0.0
    assert isinstance(lin["abs_ms_mean"], float)
    assert lin["abs_ms_mean"] > 0.5
    rows = by_bucket(runs, linear, BUCKETS)
    assert [r["bucket"] for r in rows] == [str(b) for b in BUCKETS]  # 900-4,000 tokens
    assert sum(int(str(r["batches"])) for r in rows) == 298


def test_a_buckets_row_gives_the_spread_of_its_run_times() -> None:
    """Run times of one bucket that the fit predicts on average but that spread: the mean error is small,
    the p10 / p50 / p90 of the run times show the spread (one batch in five 20 ms longer)."""
    runs = [(3000, 0.036 + (0.02 if i % 5 == 4 else 0.0)) for i in range(100)]
    rows = by_bucket(runs, errors(runs, CostModel()), BUCKETS)
    assert len(rows) == 1
    row = rows[0]
    assert row["bucket"] == "3072"
    assert (row["run_ms_p10"], row["run_ms_p50"], row["run_ms_p90"]) == (36.0, 36.0, 56.0)


def test_summary_splits_the_errors_each_way() -> None:
    s = summary("m", [0.002, 0.004, -0.001, -0.003, 0.0])
    assert s == {
        "kind": "model",
        "model": "m",
        "batches": 5,
        "abs_ms_mean": 2.0,
        "abs_ms_p90": 3.0,
        "over_share": 0.4,
        "over_ms_mean": 3.0,
        "under_ms_mean": 1.33,
    }


def test_main_prints_both_models_and_the_buckets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.model.graphs import GRAPH_BUCKETS  # what main pads to

    log = tmp_path / "stderr.log"
    runs = _step_runs(50, GRAPH_BUCKETS)
    log.write_text("\n".join(_line(t, s * 1000) for t, s in runs) + "\n", encoding="utf-8")
    assert main([str(log)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["model"] for r in rows if r["kind"] == "model"] == ["linear", "padded"]
    assert rows[1]["abs_ms_mean"] == 0.0
    assert any(r["kind"] == "bucket" for r in rows)
    assert rows[-1]["kind"] == "next_stage_corr"
