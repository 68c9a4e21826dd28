"""`python3 -m bench.e2e_plot E2E_JSONL [PNG]`: consumer lag and decisions over time of a `bench.e2e` run.

Reads the JSON lines `bench.e2e` wrote (its `lag` samples, one a second) and draws the lag (high watermark
minus committed offset, all input partitions) against run time, with each load's rate marked. Needs
matplotlib; reads only the JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bench.load_plot import read


def plot(rows: list[dict[str, Any]], png: Path) -> Path:
    """Write the lag-over-time plot of `rows` to `png` and return it (ImportError without matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    info = next((r for r in rows if r["kind"] == "info"), {})
    rates = list(info.get("rates", []))
    samples = [r for r in rows if r["kind"] == "lag"]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for load in sorted({int(r["load"]) for r in samples}):
        part = [r for r in samples if int(r["load"]) == load]
        label = f"{rates[load - 1]:g} events/s" if 0 < load <= len(rates) else "warm-up"
        ax.plot([r["t"] for r in part], [r["lag"] for r in part], label=label)
    ax.set_xlabel("run time, s")
    ax.set_ylabel("consumer lag, records")
    ax.set_title(f"Service end to end through Kafka, {info.get('device', '?')}: lag over time")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python3 -m bench.e2e_plot E2E_JSONL [PNG]", file=sys.stderr)
        return 2
    src = Path(args[0])
    print(plot(read(src), Path(args[1]) if len(args) > 1 else src.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
