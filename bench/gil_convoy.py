"""`python3 -m bench.gil_convoy`: how long a GPU thread's run of kernel launches takes on the host while
another thread runs Python, at several GIL switch intervals. Bench code (this CPU, no GPU); not a test.

Each torch call gives the GIL up around its dispatch and takes it back after, a CUDA launch as much as the
tiny CPU op timed here (`torch.add` of two 16-element tensors). A thread that holds the GIL in Python keeps
it until it blocks or the switch interval (`sys.setswitchinterval`, 5 ms by default) runs out, so every
launch of the GPU thread can wait that long: a convoy. The joint head launches 235-273 kernels a batch
eagerly (BENCHMARKS.md, "The joint head under torch.compile"), the decoder's graphs seven pieces.

Per condition one JSON line: the competitor (`none`; `busy`, Python without a pause; `bursts`, Python for
`--burst-ms` then a sleep of `--gap-ms`, as a prepare thread takes a record at a time), the switch interval,
and the p50 / p90 / max wall time of `--ops` calls over `--reps` repetitions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable

import torch


def launches(ops: int) -> float:
    """Seconds for `ops` tiny torch calls in a row on this thread."""
    a = torch.ones(16)
    b = torch.ones(16)
    began = time.perf_counter()
    for _ in range(ops):
        torch.add(a, b)
    return time.perf_counter() - began


def competitor(kind: str, burst_s: float, gap_s: float, stop: threading.Event) -> Callable[[], None]:
    """The other thread's body: Python arithmetic until `stop`, without a pause (`busy`) or in bursts of
    `burst_s` with a sleep of `gap_s` between (`bursts`)."""

    def body() -> None:
        x = 0
        while not stop.is_set():
            end = time.perf_counter() + (burst_s if kind == "bursts" else 0.05)
            while time.perf_counter() < end:
                for i in range(200):
                    x += i
            if kind == "bursts":
                time.sleep(gap_s)

    return body


def measure(
    kind: str, switch_s: float, ops: int, reps: int, burst_s: float, gap_s: float
) -> dict[str, object]:
    """One condition's JSON row (the switch interval is restored after)."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(switch_s)
    stop = threading.Event()
    other = None
    if kind != "none":
        other = threading.Thread(target=competitor(kind, burst_s, gap_s, stop), daemon=True)
        other.start()
        time.sleep(0.05)
    try:
        walls = sorted(launches(ops) * 1000 for _ in range(reps))
    finally:
        stop.set()
        if other is not None:
            other.join(5.0)
        sys.setswitchinterval(previous)
    return {
        "kind": "convoy",
        "competitor": kind,
        "switch_ms": switch_s * 1000,
        "ops": ops,
        "reps": reps,
        "p50_ms": round(statistics.median(walls), 2),
        "p90_ms": round(walls[min(reps - 1, int(0.9 * reps))], 2),
        "max_ms": round(walls[-1], 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.gil_convoy", description=__doc__.split("\n")[0])
    p.add_argument("--ops", type=int, default=250, help="launches in a row (the head's eager kernels)")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--switch-ms", default="5,1,0.2", help="switch intervals, comma-separated")
    p.add_argument("--burst-ms", type=float, default=4.0, help="the bursts competitor's Python time")
    p.add_argument("--gap-ms", type=float, default=4.0, help="its sleep between bursts")
    p.add_argument("--competitors", default="none,bursts,busy")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    for kind in args.competitors.split(","):
        if kind not in ("none", "busy", "bursts"):
            p.error(f"unknown competitor {kind!r}")
        for switch in (float(s) / 1000 for s in args.switch_ms.split(",")):
            row = measure(kind, switch, args.ops, args.reps, args.burst_ms / 1000, args.gap_ms / 1000)
            print(json.dumps(row), flush=True)
            if kind == "none":
                break  # alone, the interval does not matter
    return 0


if __name__ == "__main__":
    sys.exit(main())
