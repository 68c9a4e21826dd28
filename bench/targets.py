"""`python3 -m bench.targets DIR`: issues 29 and 30's done-when figures, read from one call of
`scripts/device-targets.sh`, each against its target.

DIR holds the steps' outputs as that script lays them out (any step may be missing; its rows then read "not
run"):

- `modes/fp8_modes.jsonl` (`bench.fp8_modes`): tokens/s at budget 65,536 of `bf16` and of the best FP8
  text-only mode, and that mode's serving peak;
- `one_fp8/one_request.jsonl`, `one_bf16/one_request.jsonl` (`bench.one_request`): one 800-token request's
  `decide` p50 (the first `request` of each file, the shipped kernels);
- `e2e/e2e.jsonl` (`bench.e2e --shares`): p50 at 25% and p99 at 70% of the engine-only capacity the run
  measured first, every load at that share (within 0.02), and the capacity through Kafka: the decisions/s of
  every load offered above that capacity (share 1.02 and up) over it;
- `mixed/e2e.jsonl` (`bench.e2e --mixed`): HTTP and priority-topic p99, Kafka throughput over engine-only,
  lost and duplicated events, offsets committed at the end.

Prints a markdown table (the card named from the files) and a JSON line per target; exits 0 whatever the
verdicts (a report, not a test).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

Row = dict[str, object]
"""One JSON line of a bench's output."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """A target's reading: `value` None when its step did not run (or printed no such line)."""

    target: str
    bound: str
    value: float | None
    met: bool | None
    source: str

    def cell(self) -> str:
        return "not run" if self.value is None else f"{self.value:g}"

    def status(self) -> str:
        return {None: "not run", True: "met", False: "not met"}[self.met]


def read_rows(path: Path) -> list[Row]:
    """The JSON object lines of `path` ([] for a missing file; other lines are skipped)."""
    if not path.is_file():
        return []
    rows: list[Row] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _num(row: Row, key: str) -> float | None:
    value = row.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _of_kind(rows: Sequence[Row], kind: str) -> Iterator[Row]:
    return (r for r in rows if r.get("kind") == kind)


def _verdict(
    target: str, bound: str, value: float | None, ok: Callable[[float], bool], source: str
) -> Verdict:
    return Verdict(target, bound, value, None if value is None else ok(value), source)


def _is_one(value: float) -> bool:
    return value == 1.0


def _within_300(value: float) -> bool:
    return value <= 300.0


def modes_verdicts(rows: Sequence[Row]) -> list[Verdict]:
    """Throughput and memory from `bench.fp8_modes`: bf16's tokens/s, and the FP8 text-only mode with the
    most tokens/s (with or without the sm90 kernels) with its serving peak."""
    modes = {str(r.get("mode")): r for r in _of_kind(rows, "mode")}
    bf16 = _num(modes["bf16"], "tok_s") if "bf16" in modes else None
    text = [r for name, r in modes.items() if name.startswith("fp8_text_only")]
    best = max(text, key=lambda r: _num(r, "tok_s") or 0.0, default=None)
    source = "fp8_modes" if best is None else f"fp8_modes {best.get('mode')}"
    fp8 = None if best is None else _num(best, "tok_s")
    peak = None if best is None else _num(best, "serving_peak_gb")
    return [
        _verdict("throughput FP8, budget 65,536 (tok/s)", ">= 125,000", fp8, lambda v: v >= 125_000, source),
        _verdict("throughput bf16, budget 65,536 (tok/s)", ">= 92,000", bf16, lambda v: v >= 92_000, "bf16"),
        _verdict("FP8 text-only serving peak (GB)", "<= 75", peak, lambda v: v <= 75.0, source),
    ]


def one_request_ms(rows: Sequence[Row]) -> float | None:
    """`decide` p50 of the first request measured (the shipped kernels; `--sm90` adds later ones)."""
    for row in rows:
        if row.get("kind") == "stage" and row.get("stage") == "decide":
            return _num(row, "ms_p50")
    return None


SATURATED_SHARE = 1.02
"""A load offered at this share of the engine-only capacity or more saturates the service: its decisions/s
over that capacity is the capacity through Kafka."""


def shares_verdicts(rows: Sequence[Row]) -> list[Verdict]:
    """p50 at 25% and p99 at 70% of the run's engine-only capacity (the worst load at each share), and the
    capacity through Kafka over engine-only (the worst saturated load)."""
    capacity = next((_num(r, "events_s") for r in _of_kind(rows, "capacity")), None)
    at: dict[float, list[Row]] = {0.25: [], 0.7: []}
    through: list[float] = []  # events out/s over the capacity, of each saturated load
    for load in _of_kind(rows, "load"):
        rate, out = _num(load, "rate"), _num(load, "events_out_s")
        if not capacity or rate is None:
            continue
        for share, loads in at.items():
            if abs(rate / capacity - share) <= 0.02:
                loads.append(load)
        if rate / capacity >= SATURATED_SHARE and out is not None:
            through.append(round(out / capacity, 3))

    def worst(share: float, key: str) -> float | None:
        values = [v for r in at[share] if (v := _num(r, key)) is not None]
        return max(values, default=None)

    p99, p50 = worst(0.7, "p99_ms"), worst(0.25, "p50_ms")
    return [
        _verdict("p99 at 70% load (ms)", "<= 150", p99, lambda v: v <= 150.0, f"e2e, {len(at[0.7])} load(s)"),
        _verdict("p50 at 25% load (ms)", "<= 45", p50, lambda v: v <= 45.0, f"e2e, {len(at[0.25])} load(s)"),
        _verdict(
            "capacity through Kafka / engine-only",
            ">= 0.98",
            min(through, default=None),
            lambda v: v >= 0.98,
            f"e2e, {len(through)} saturated load(s)",
        ),
    ]


def mixed_verdicts(rows: Sequence[Row]) -> list[Verdict]:
    """The saturated run: HTTP and priority-topic p99, Kafka over engine-only, nothing lost or doubled,
    offsets at the high watermarks."""
    mixed = next(_of_kind(rows, "mixed"), None)
    if mixed is None:
        values: dict[str, float | None] = dict.fromkeys(("http", "critical", "kafka", "lost", "offsets"))
    else:
        classes = mixed.get("classes")
        topics = mixed.get("topics")
        classes = classes if isinstance(classes, dict) else {}
        topics = topics if isinstance(topics, dict) else {}
        bad = sum(
            (_num(t, "lost") or 0.0) + (_num(t, "duplicates") or 0.0)
            for t in topics.values()
            if isinstance(t, dict)
        )
        values = {
            "http": _num(classes.get("http", {}), "p99_ms"),
            "critical": _num(classes.get("critical", {}), "p99_ms"),
            "kafka": _num(mixed, "kafka_out_over_engine_only"),
            "lost": bad,
            "offsets": 1.0 if mixed.get("offsets_at_end") is True else 0.0,
        }
    src = "e2e --mixed"
    return [
        _verdict("saturated: HTTP p99 (ms)", "<= 300", values["http"], _within_300, src),
        _verdict("saturated: priority topic p99 (ms)", "<= 300", values["critical"], _within_300, src),
        _verdict("saturated: Kafka out / engine-only", ">= 0.9", values["kafka"], lambda v: v >= 0.9, src),
        _verdict("saturated: events lost or duplicated", "0", values["lost"], lambda v: v == 0.0, src),
        _verdict("saturated: offsets at the high watermarks (1 yes)", "1", values["offsets"], _is_one, src),
    ]


def verdicts(root: Path) -> list[Verdict]:
    """Every target's reading from the step folders under `root` (see the module docstring)."""
    fp8 = one_request_ms(read_rows(root / "one_fp8" / "one_request.jsonl"))
    bf16 = one_request_ms(read_rows(root / "one_bf16" / "one_request.jsonl"))
    return [
        *shares_verdicts(read_rows(root / "e2e" / "e2e.jsonl")),
        *mixed_verdicts(read_rows(root / "mixed" / "e2e.jsonl")),
        _verdict("one 800-token request, FP8 text (ms)", "<= 12", fp8, lambda v: v <= 12.0, "decide p50"),
        _verdict("one 800-token request, bf16 (ms)", "<= 17", bf16, lambda v: v <= 17.0, "decide p50"),
        *modes_verdicts(read_rows(root / "modes" / "fp8_modes.jsonl")),
    ]


def devices(root: Path) -> list[str]:
    """The GPU names the steps' `info` lines (and `bench.one_request`'s `request` lines) give, in step
    order, each once."""
    names: list[str] = []
    for path in sorted(root.glob("*/*.jsonl")):
        for row in read_rows(path):
            named = row.get("kind") in ("info", "request")
            name = row.get("device", row.get("gpu")) if named else None
            if isinstance(name, str) and name not in names:
                names.append(name)
    return names


def report(root: Path) -> str:
    """The markdown table and one JSON line per target."""
    found = verdicts(root)
    lines = [
        f"targets of issues 29 and 30 on {', '.join(devices(root)) or 'no device named'} ({root})",
        "",
        "| target | bound | now | status | from |",
        "|---|---|---|---|---|",
        *(f"| {v.target} | {v.bound} | {v.cell()} | {v.status()} | {v.source} |" for v in found),
        "",
        *(json.dumps({"kind": "target", "target": v.target, "value": v.value, "met": v.met}) for v in found),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("root", type=Path, help="the folder scripts/device-targets.sh filled")
    args = p.parse_args(argv)
    sys.stdout.write(report(args.root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
