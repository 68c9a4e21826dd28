"""Reporting for `bench.engine`: JSON lines, a markdown table and the throughput plot."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the engine (and PyAV behind it) only for the type: probes import this module alone
    from engine.runner import Engine


def emit_line(rows: list[str], **row: Any) -> None:
    """Print `row` as one JSON line and keep it in `rows` (for probes that write their lines at the end)."""
    line = json.dumps(row)
    print(line, flush=True)
    rows.append(line)


def start(p: argparse.ArgumentParser) -> tuple[argparse.Namespace, Path, list[str]]:
    """A probe's start: its arguments parsed, its `--out` folder made, and an empty list for its lines."""
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return args, out, []


@dataclass
class Bench:
    engine: Engine
    out: Path
    rows: list[dict[str, Any]]

    def emit(self, **row: Any) -> None:
        self.rows.append(row)
        print(json.dumps(row), flush=True)


def write_outputs(b: Bench, budgets: Sequence[int], sweep: Sequence[dict[str, float]]) -> None:
    (b.out / "engine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in b.rows))
    lines = [
        "| kind | workload | tok/s | req/s | p50 ms | p99 ms | MFU | extra |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in b.rows:
        if r["kind"] == "info":
            continue
        extra = {
            k: v
            for k, v in r.items()
            if k
            not in {
                "kind",
                "workload",
                "tok_s",
                "req_s",
                "mfu",
                "batch_ms_p50",
                "batch_ms_p99",
                "ms_p50",
                "ms_p99",
            }
        }
        lines.append(
            f"| {r['kind']} | {r.get('workload', '')} | {r.get('tok_s', '')} | {r.get('req_s', '')} | "
            f"{r.get('batch_ms_p50', r.get('ms_p50', ''))} | {r.get('batch_ms_p99', r.get('ms_p99', ''))} | "
            f"{r.get('mfu', '')} | {json.dumps(extra) if extra else ''} |"
        )
    (b.out / "engine.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(list(budgets), [r["tok_s"] for r in sweep], marker="o", label="engine path, whole run")
        ax.plot(
            list(budgets), [r["steady_tok_s"] for r in sweep], marker="s", label="engine path, steady state"
        )
        base = [r for r in b.rows if r["kind"] == "baseline" and r["workload"] == "512-token requests"]
        if base:
            ax.axhline(
                base[0]["tok_s"], color="gray", linestyle="--", label="plain transformers backbone (64x512)"
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch token budget")
        ax.set_ylabel("tokens/s (512-token requests)")
        ax.set_title("Clef-omni full size, random bf16, one H200")
        ax.legend()
        fig.tight_layout()
        fig.savefig(b.out / "throughput.png", dpi=120)
    except ImportError:
        print("matplotlib missing: no plot", flush=True)
