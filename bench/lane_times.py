"""`python -m bench.lane_times LOG [LOG...]`: where the urgent lane's time went, from a service log.

Reads JSON log lines (the service's format; `bench.e2e` keeps them in `stderr.log` under
`BENCH_E2E_LOG_LEVEL=info`), takes every `batch` line of an urgent batch that carries its lane times
(`consumer.batching.gpu.LaneTimes`: `stage_ms`, `lane_wait_ms`, `run_ms`, `settle_ms`, `respond_ms`,
`inside`) and prints one JSON line per log: the batches counted, how many ran inside a bulk batch, and
p50/p95/p99/max of each time in ms. Other lines (and lines that are not JSON) are skipped. Not a test.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.load_run import quantiles

FIELDS = ("stage_ms", "lane_wait_ms", "run_ms", "settle_ms", "respond_ms")
"""The lane times of one urgent batch's `batch` line, in the order they happen."""


def lane_rows(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The urgent `batch` lines of `lines` that carry every lane time, parsed."""
    rows: list[dict[str, Any]] = []
    for line in lines:
        if '"batch"' not in line:
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        urgent = isinstance(row, dict) and row.get("event") == "batch" and row.get("urgent") is True
        if urgent and all(isinstance(row.get(f), int | float) for f in FIELDS):
            rows.append(row)
    return rows


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Count, inside count and the quantiles (ms) of each of `FIELDS` over `rows`."""
    out: dict[str, Any] = {"urgent_batches": len(rows), "inside": sum(1 for r in rows if r.get("inside"))}
    for f in FIELDS:
        out[f] = quantiles([float(r[f]) / 1000.0 for r in rows])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths:
        print("usage: python -m bench.lane_times LOG [LOG...]", file=sys.stderr)
        return 2
    for path in paths:
        with Path(path).open(encoding="utf-8", errors="replace") as f:
            print(json.dumps({"log": path, **summary(lane_rows(f))}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
