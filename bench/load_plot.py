"""`python3 -m bench.load_plot LOAD_JSONL [PNG]`: latency vs load, fixed and adaptive side by side.

Reads the JSON lines `bench.load` wrote and draws p50 and p99 (arrival -> answer) against the offered load
for each batching mode, with the single-request latency as a line. Needs matplotlib (run it wherever that
is installed; it reads only the JSON).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def read(path: Path) -> list[dict[str, Any]]:
    """Every JSON line of a `bench.load` output file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot(rows: list[dict[str, Any]], png: Path) -> Path:
    """Write the latency-vs-load plot of `rows` to `png` and return it. Raises ImportError without
    matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    info = next((r for r in rows if r["kind"] == "info"), {})
    single = next((r for r in rows if r["kind"] == "single"), None)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, color in (("fixed", "tab:orange"), ("adaptive", "tab:blue")):
        loads = [r for r in rows if r["kind"] == "load" and r["mode"] == mode]
        if not loads:
            continue
        x = [100 * r["load"] for r in loads]
        ax.plot(x, [r["p50_ms"] for r in loads], marker="o", color=color, label=f"{mode} p50")
        ax.plot(x, [r["p99_ms"] for r in loads], marker="s", linestyle="--", color=color, label=f"{mode} p99")
    if single is not None:
        ax.axhline(single["direct_p50_ms"], color="gray", linestyle=":", label="single request p50")
    ax.set_yscale("log")
    ax.set_xlabel("offered load, % of the best fixed budget's capacity")
    ax.set_ylabel("arrival -> answer latency, ms")
    ax.set_title(f"Latency under load, {info.get('device', '?')}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python3 -m bench.load_plot LOAD_JSONL [PNG]", file=sys.stderr)
        return 2
    src = Path(args[0])
    png = Path(args[1]) if len(args) > 1 else src.with_suffix(".png")
    print(plot(read(src), png))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
