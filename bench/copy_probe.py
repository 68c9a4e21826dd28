"""Bench-only probe: does staging's device copy block while another thread's GPU work runs?

`python3 -m bench.copy_probe` (CUDA; `bash scripts/device-engine.sh copy`). One thread keeps the GPU busy
on the default stream, the way the service's GPU thread does: a CUDA graph of matmuls (about `--busy-ms` of
GPU time) replayed, then a small device-to-host copy that waits for it (the GIL released meanwhile), either
into pageable memory (`.cpu()`, the engine's copy before `engine.model.clef.to_host`) or through `to_host`
(pinned memory, an event). Another thread stages like
`engine.batching.collate._to_device_packed`: a pinned buffer (`torch.empty(pin_memory=True)`), `torch.cat`
into it, a non-blocking copy to the device, views. Each step's wall time is printed (p50 / p90 / max, ms),
alone and with the busy thread running in each way, one JSON line per case. Never imported by the product.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import torch


def _stage(sizes: list[int], dev: torch.device, times: dict[str, list[float]]) -> None:
    parts = [torch.randint(0, 1000, (n,), dtype=torch.int64) for n in sizes]
    t0 = time.perf_counter()
    staging = torch.empty(sum(sizes), dtype=torch.int64, pin_memory=True)
    t1 = time.perf_counter()
    torch.cat(parts, out=staging)
    t2 = time.perf_counter()
    flat = staging.to(dev, non_blocking=True)
    t3 = time.perf_counter()
    views = torch.split(flat, sizes)
    t4 = time.perf_counter()
    del views
    for name, seconds in (
        ("empty_pinned", t1 - t0),
        ("cat", t2 - t1),
        ("to_device", t3 - t2),
        ("split", t4 - t3),
    ):
        times[name].append(seconds * 1000)


def _busy(stop: threading.Event, busy_ms: float, dev: torch.device, pinned: bool) -> None:
    from engine.model.clef import to_host

    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize(dev)
    per = (time.perf_counter() - t0) / 10 * 1000
    reps = max(1, int(busy_ms / per))
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up before capture
        out = a @ b
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            out = a @ b
    while not stop.is_set():
        graph.replay()
        if pinned:
            to_host(out[0, :8])
        else:
            out[0, :8].cpu()  # waits for the replay, GIL released


def _case(name: str, sizes: list[int], dev: torch.device, calls: int, gap_s: float) -> dict[str, object]:
    times: dict[str, list[float]] = {"empty_pinned": [], "cat": [], "to_device": [], "split": []}
    for _ in range(calls):
        _stage(sizes, dev, times)
        time.sleep(gap_s)
    row: dict[str, object] = {"case": name}
    for step, values in times.items():
        values.sort()
        row[step] = [
            round(statistics.median(values), 3),
            round(values[int(0.9 * len(values))], 3),
            round(values[-1], 3),
        ]
    return row


def main() -> None:
    p = argparse.ArgumentParser(prog="bench.copy_probe")
    p.add_argument("--busy-ms", type=float, default=40.0)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--gap-ms", type=float, default=7.0)
    args = p.parse_args()
    dev = torch.device("cuda")
    sizes = [3000, 3000, 3000, 3000, 3000, 200, 200, 50]  # about a 3,000-token batch's index tensors
    torch.empty(1, device=dev)
    print(json.dumps(_case("alone", sizes, dev, args.calls, args.gap_ms / 1000)), flush=True)
    for pinned in (False, True):
        stop = threading.Event()
        busy = threading.Thread(target=_busy, args=(stop, args.busy_ms, dev, pinned), daemon=True)
        busy.start()
        time.sleep(1.0)
        name = "gpu busy, copy back " + ("through to_host" if pinned else "into pageable memory")
        try:
            print(json.dumps(_case(name, sizes, dev, args.calls, args.gap_ms / 1000)), flush=True)
        finally:
            stop.set()
            busy.join(10)


if __name__ == "__main__":
    main()
