"""`python3 -m bench.queue_model`: how low can p99 go at a share of capacity, whatever the batcher does?

A discrete-event model of one GPU behind an ideal batcher, for the tail-latency targets (issue 29):
events arrive at Poisson times with `bench.load`'s token mix; whenever the GPU is free, the batcher takes
everything that has arrived (work-conserving, greedy; `--max-tokens` caps a batch, the way a token budget
does) and the batch takes `a + b * tokens / mean_tokens` seconds: `a` the fixed cost of a batch (reading
the experts' weights once) and `b` the cost of one mean-sized record (so `1 / b` is the capacity in
events/s as batches grow). No Kafka, no fetch or publish time, no queueing in front of the batcher, no
preemption: what the engine side of a service with that cost reaches when its batcher never waits to fill
a batch (waiting only adds latency here; cutting a batch smaller pays `a` once more). A model, not a
measurement: compare it with the benches' figures, never quote it as one.

Derive `a` and `b` from measured figures: `b` = 1 / capacity (events/s through Kafka at large batches),
`a` = one request's latency minus `b * its tokens / mean_tokens`; or give them (`--fixed-ms`,
`--per-record-ms`, e.g. fitted to the service's `batch` log lines; the shares stay shares of `--capacity`).
Defaults: FP8 text-only from disk, levelled (capacity 138.3 events/s, one 800-token request 18.62 ms,
`BENCHMARKS.md`).

Prints one JSON line per share (p50, p99, max ms, mean records per batch, GPU busy share), then, with
`--target-p99-ms`, the largest `a` (same `b`) and the largest `b` (same `a / b`) that bring the p99 at
`--solve-share` under the target (bisection on the model).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: `bench.load.MIX`'s token mix: (share, min tokens, max tokens), uniform inside a class.
MIX = ((0.4, 200, 500), (0.4, 500, 1000), (0.2, 1000, 1500))


@dataclass(frozen=True, slots=True)
class Cost:
    """A batch of `tokens` takes `fixed_s + per_record_s * tokens / mean_tokens` seconds."""

    fixed_s: float
    per_record_s: float
    mean_tokens: float

    def batch_s(self, tokens: float) -> float:
        return self.fixed_s + self.per_record_s * tokens / self.mean_tokens


def mix_tokens(rng: random.Random) -> float:
    """One event's token count drawn from `MIX`."""
    r = rng.random()
    acc = 0.0
    for share, lo, hi in MIX:
        acc += share
        if r <= acc:
            return rng.uniform(lo, hi)
    return float(MIX[-1][2])


def mix_mean() -> float:
    """The mean token count of `MIX`."""
    return sum(share * (lo + hi) / 2 for share, lo, hi in MIX)


def poisson_arrivals(rate: float, events: int, seed: int = 1) -> list[tuple[float, float]]:
    """(seconds from the start, tokens) of `events` Poisson arrivals at `rate`/s with `MIX`'s token counts,
    drawn from `random.Random(seed)`: the same list for the same arguments (`bench.batcher_model` replays
    it through the service's batcher)."""
    rng = random.Random(seed)
    t = 0.0
    out: list[tuple[float, float]] = []
    for _ in range(events):
        t += rng.expovariate(rate)
        out.append((t, mix_tokens(rng)))
    return out


def simulate(
    cost: Cost, rate: float, events: int, seed: int = 1, max_tokens: float | None = None
) -> dict[str, float]:
    """Latency (arrival to batch end) of `events` Poisson arrivals at `rate`/s through the greedy batcher:
    p50, p99 and max ms, mean records per batch, and the GPU busy share (busy time over the span from the
    first arrival to the last batch end)."""
    arrivals = poisson_arrivals(rate, events, seed)
    free = 0.0
    busy = 0.0
    batches = 0
    i = 0
    latencies: list[float] = []
    while i < events:
        start = max(free, arrivals[i][0])
        j = i
        tokens = 0.0
        while j < events and arrivals[j][0] <= start:
            if j > i and max_tokens is not None and tokens + arrivals[j][1] > max_tokens:
                break
            tokens += arrivals[j][1]
            j += 1
        if j == i:  # nothing waiting: the batch is the next arrival alone
            tokens, j = arrivals[i][1], i + 1
        duration = cost.batch_s(tokens)
        free = start + duration
        busy += duration
        batches += 1
        latencies += [free - arrivals[x][0] for x in range(i, j)]
        i = j
    latencies.sort()

    def ms(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1)

    span = free - arrivals[0][0]
    return {
        "p50_ms": ms(0.5),
        "p99_ms": ms(0.99),
        "max_ms": ms(1.0),
        "records_per_batch": round(events / batches, 2),
        "gpu_busy": round(busy / span, 3) if span > 0 else 0.0,
    }


def _bisect(target_ms: float, lo: float, hi: float, f: Callable[[float], float]) -> float:
    """The largest x in [lo, hi] with `f(x)` (the p99 ms the model gives for x) at most `target_ms`
    (24 halvings, assuming `f` grows with x); 0 when even `lo` misses it."""
    if f(lo) > target_ms:
        return 0.0
    for _ in range(24):
        mid = (lo + hi) / 2
        if f(mid) <= target_ms:
            lo = mid
        else:
            hi = mid
    return lo


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m bench.queue_model", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--capacity", type=float, default=138.3, help="events/s at large batches (1 / b)")
    p.add_argument("--one-request-ms", type=float, default=18.62, help="one request's latency")
    p.add_argument("--one-request-tokens", type=float, default=800.0)
    p.add_argument("--fixed-ms", type=float, default=None, help="a, given instead of derived")
    p.add_argument("--per-record-ms", type=float, default=None, help="b, given instead of derived")
    p.add_argument("--shares", default="0.25,0.5,0.7", help="arrival rates as shares of --capacity")
    p.add_argument("--events", type=int, default=100_000, help="arrivals per share")
    p.add_argument("--max-tokens", type=float, default=None, help="cap on a batch's tokens (default none)")
    p.add_argument("--target-p99-ms", type=float, default=None, help="solve for the costs that reach this")
    p.add_argument("--solve-share", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    mean = mix_mean()
    b = 1.0 / args.capacity if args.per_record_ms is None else args.per_record_ms / 1000
    a = args.one_request_ms / 1000 - b * args.one_request_tokens / mean
    a = a if args.fixed_ms is None else args.fixed_ms / 1000
    if a < 0:
        raise SystemExit("bench.queue_model: one request is faster than 1/capacity allows (a < 0)")
    cost = Cost(a, b, mean)
    print(json.dumps({
        "kind": "cost", "fixed_ms": round(a * 1000, 2), "per_record_ms": round(b * 1000, 2),
        "mean_tokens": mean, "capacity": args.capacity, "max_tokens": args.max_tokens,
    }))  # fmt: skip
    for share in (float(x) for x in args.shares.split(",")):
        figures = simulate(cost, share * args.capacity, args.events, args.seed, args.max_tokens)
        print(
            json.dumps({"kind": "share", "share": share, "rate": round(share * args.capacity, 2), **figures})
        )
    if args.target_p99_ms is not None:
        share, target, n = args.solve_share, args.target_p99_ms, args.events

        def with_fixed(x: float) -> float:
            return simulate(Cost(x, b, mean), share / b, n, args.seed, args.max_tokens)["p99_ms"]

        def with_scale(x: float) -> float:  # both costs scaled: b = x, a = x * (a / b)
            return simulate(Cost(x * a / b, x, mean), share / x, n, args.seed, args.max_tokens)["p99_ms"]

        fixed = _bisect(target, 0.0, a * 4, with_fixed)
        scale = _bisect(target, b / 1000, b * 4, with_scale)
        print(json.dumps({
            "kind": "solve", "share": share, "target_p99_ms": target,
            "max_fixed_ms_same_b": round(fixed * 1000, 2),
            "max_per_record_ms_same_ratio": round(scale * 1000, 2),
            "capacity_needed_same_ratio": round(1 / scale, 1) if scale > 0 else None,
        }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
