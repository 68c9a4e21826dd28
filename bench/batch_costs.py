"""`python3 -m bench.batch_costs LOG`: how well a cost model predicts the GPU time of a service's batches.

LOG holds the service's JSON log lines (`bench.e2e` keeps them with `BENCH_E2E_LOG_LEVEL=info`; on the GPU
machine `scripts/device-e2e.sh` returns them as `stderr.log`). The batcher logs one `batch` line per batch
with its tokens and its `run_ms` on the GPU thread. This replays the normal batches (not urgent, not split,
none failed) in order through two cost models. Each predicts a batch from a fit over the batches before it,
as the batcher's does:
- `linear`: the service's `consumer.batching.adaptive.CostModel` over the batch's tokens;
- `padded`: the same fit over the tokens a graph replay computes (`bench.batcher_model.PaddedCost`, the
  engine's `GRAPH_BUCKETS`).

It prints one JSON line per model: batches predicted, the mean and p90 absolute error (ms), the share over,
and the mean error each way. Then, for the linear model, one line per graph bucket: batches, mean signed
error (ms) and the p10 / p50 / p90 of those batches' run times (ms). If the linear model's error follows the
bucket and the padded one's is small, the padding is the cause; if the bucket's mean error is small but its
run times spread, the run time itself varies. Last, `next_stage` lines: each batch's run time less the
median of its bucket's (its residual), grouped by how long the batch after it took to stage (`stage_ms`, which
runs on the prepare thread while this batch is on the GPU thread), with the correlation of the two. A
residual that grows with the next batch's staging says the two meet something in common (the GIL, the
driver, a wait for the GPU); which, the stage probe's `to_device`, `launch` and `gc_*` rows tell. A line that
is not JSON, or not a normal batch's, is skipped.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

from bench.batcher_model import PaddedCost, padded
from consumer.batching.adaptive import CostLike, CostModel


def batches(lines: Iterable[str]) -> list[tuple[int, float]]:
    """(tokens, GPU seconds) of each normal batch logged in `lines`, in order."""
    return [(tokens, seconds) for tokens, seconds, _ in batch_rows(lines)]


def batch_rows(lines: Iterable[str]) -> list[tuple[int, float, float]]:
    """(tokens, GPU seconds, staging ms; 0.0 when not logged) of each normal batch in `lines`, in order."""
    out: list[tuple[int, float, float]] = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict) or row.get("event") != "batch" or row.get("urgent"):
            continue
        if row.get("splits") or row.get("failed") or "run_ms" not in row:
            continue
        out.append((int(row["tokens"]), float(row["run_ms"]) / 1000.0, float(row.get("stage_ms", 0.0))))
    return out


def errors(runs: Sequence[tuple[int, float]], cost: CostLike) -> list[float]:
    """Each batch's GPU seconds minus `cost`'s prediction from the batches before it (those it could not
    predict yet left out); `cost` learns every batch after predicting it."""
    out: list[float] = []
    for tokens, seconds in runs:
        predicted = cost.predict(tokens)
        if predicted is not None:
            out.append(seconds - predicted)
        cost.observe(tokens, seconds)
    return out


def summary(name: str, errs: Sequence[float]) -> dict[str, object]:
    """The figures of one model's errors (seconds in, ms out)."""
    over = [e for e in errs if e > 0]
    under = [-e for e in errs if e <= 0]
    magnitudes = sorted(abs(e) for e in errs)

    def ms(values: Sequence[float]) -> float:
        return round(statistics.fmean(values) * 1000, 2) if values else 0.0

    return {
        "kind": "model",
        "model": name,
        "batches": len(errs),
        "abs_ms_mean": ms(magnitudes),
        "abs_ms_p90": round(magnitudes[int(0.9 * (len(magnitudes) - 1))] * 1000, 2) if magnitudes else 0.0,
        "over_share": round(len(over) / len(errs), 3) if errs else 0.0,
        "over_ms_mean": ms(over),
        "under_ms_mean": ms(under),
    }


def by_bucket(
    runs: Sequence[tuple[int, float]], errs: Sequence[float], buckets: Sequence[int]
) -> list[dict[str, object]]:
    """The linear model's mean signed error (ms) per graph bucket (the batches it predicted: the last
    `len(errs)` of `runs`), with the p10 / p50 / p90 of their run times (ms), buckets in ascending order;
    above the largest, one row `eager`."""
    groups: dict[int, list[tuple[float, float]]] = {}
    for (tokens, seconds), err in zip(runs[len(runs) - len(errs) :], errs, strict=True):
        groups.setdefault(padded(tokens, buckets), []).append((err, seconds))
    largest = max(buckets, default=0)
    rows: dict[str, list[tuple[float, float]]] = {}
    for size in sorted(groups):
        rows.setdefault(str(size) if size <= largest else "eager", []).extend(groups[size])

    def run_ms(pairs: Sequence[tuple[float, float]], q: float) -> float:
        ordered = sorted(seconds for _, seconds in pairs)
        return round(ordered[int(q * (len(ordered) - 1))] * 1000, 2)

    return [
        {
            "kind": "bucket",
            "bucket": key,
            "batches": len(v),
            "error_ms_mean": round(statistics.fmean(err for err, _ in v) * 1000, 2),
            "run_ms_p10": run_ms(v, 0.1),
            "run_ms_p50": round(statistics.median(seconds for _, seconds in v) * 1000, 2),
            "run_ms_p90": run_ms(v, 0.9),
        }
        for key, v in rows.items()
    ]


NEXT_STAGE_BANDS = (0.0, 2.0, 4.0, 6.0, 10.0)
"""Lower edges (ms) of the `next_stage` groups; the last is open."""


def next_stage(rows: Sequence[tuple[int, float, float]], buckets: Sequence[int]) -> list[dict[str, object]]:
    """Each batch but the last: its run time less its bucket's median run time (ms), grouped by the next
    batch's staging ms (`NEXT_STAGE_BANDS`): batches, residual mean and p50 per group (empty groups left
    out), then one `next_stage_corr` row with the Pearson correlation of the two (None under 3 batches or
    with no spread)."""
    groups: dict[int, list[float]] = {}
    for tokens, seconds, _ in rows:
        groups.setdefault(padded(tokens, buckets), []).append(seconds)
    medians = {size: statistics.median(v) for size, v in groups.items()}
    pairs = [
        ((seconds - medians[padded(tokens, buckets)]) * 1000, after[2])
        for (tokens, seconds, _), after in itertools.pairwise(rows)
    ]
    out: list[dict[str, object]] = []
    edges = [*NEXT_STAGE_BANDS, float("inf")]
    for low, high in itertools.pairwise(edges):
        residuals = [r for r, stage in pairs if low <= stage < high]
        if residuals:
            out.append(
                {
                    "kind": "next_stage",
                    "stage_ms": f"{low:g}-{high:g}",
                    "batches": len(residuals),
                    "residual_ms_mean": round(statistics.fmean(residuals), 2),
                    "residual_ms_p50": round(statistics.median(residuals), 2),
                }
            )
    corr: float | None = None
    if len(pairs) >= 3:
        try:
            corr = round(statistics.correlation([r for r, _ in pairs], [s for _, s in pairs]), 3)
        except statistics.StatisticsError:  # one of them constant
            corr = None
    out.append({"kind": "next_stage_corr", "batches": len(pairs), "correlation": corr})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m bench.batch_costs", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("log", type=Path, help="the service's JSON log lines (e.g. device-e2e.sh's stderr.log)")
    p.add_argument("--window", type=int, default=64, help="batches each fit is over (the batcher's: 64)")
    args = p.parse_args(argv)
    from engine.model.graphs import GRAPH_BUCKETS

    rows = batch_rows(args.log.read_text(encoding="utf-8", errors="replace").splitlines())
    runs = [(tokens, seconds) for tokens, seconds, _ in rows]
    linear = errors(runs, CostModel(args.window))
    padded_errs = errors(runs, PaddedCost(GRAPH_BUCKETS, CostModel(args.window)))
    print(json.dumps(summary("linear", linear)))
    print(json.dumps(summary("padded", padded_errs)))
    for row in [*by_bucket(runs, linear, GRAPH_BUCKETS), *next_stage(rows, GRAPH_BUCKETS)]:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
