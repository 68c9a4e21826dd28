"""`python3 -m bench.batcher_model`: the service's batcher against the ideal one, with the GPU modelled.

`bench.queue_model` gives the latency an ideal greedy batcher reaches with a batch cost `a + b * tokens /
mean` (it cuts the next batch the instant the GPU frees up, and staging costs nothing). This bench runs the
service's own `consumer.batching.batcher.Batcher` (default `BatchingSettings`: adaptive, one prepare
thread, two pending batches) on the same Poisson arrivals (same seed, same token mix) against
`TimedEngine`, an engine whose `run` sleeps the modelled batch cost on the GPU thread (a sleep releases the
GIL, as waiting for CUDA does) and whose prepare, stage and respond spin the CPU for given times (holding the
GIL, as tokenising and collating do). Real event loop, real threads, real timers; no model, no Kafka.

Per share of the modelled capacity it prints, as JSON lines, the batcher's and the ideal model's latency
(arrival to answer: p50, p99, max ms; and arrival to the end of its batch on the GPU, the model's measure),
records per batch and GPU busy share, the GPU's idle time while records waited (`idle_waiting_ms`: from a
batch's end to the next batch's start, when a record of that next batch had already arrived; per batch,
mean and p50), and each record's mean path through the batcher from its metrics (`path_ms_mean`: prepare,
queue wait, stage_wait, stage, gpu_wait, run, back, respond_wait, respond). What separates the two is the
batcher's own cost: when it cuts, staging, hand-offs. Not a test: it asserts nothing, and a CPU with other
load moves its figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from bench.gil_convoy import launches
from bench.queue_model import Cost, mix_mean, poisson_arrivals, simulate
from consumer.batching.adaptive import CostLike, CostModel
from consumer.batching.batch_metrics import COST_DIRECTIONS
from consumer.batching.batcher import Batcher, Outcome
from consumer.batching.gpu import BATCH_STEPS
from consumer.logging import configure_logging
from consumer.metrics import Metrics
from consumer.runtime import set_switch_interval
from consumer.settings import BatchingSettings
from devtools.stub import StubEngine
from engine.batching.cut import SERVICE_LIMITS, BatchLimits
from engine.model.graphs import graph_pieces
from engine.types import Between, RunsWhenLaunched
from schemas.request import SystemOneRequest
from schemas.response import SystemOneResponse
from schemas.systemone import parse_request


@dataclass(frozen=True, slots=True)
class TimedRecord:
    """One prepared event: its token count and its scheduled arrival (perf_counter seconds)."""

    num_tokens: int
    arrival: float


@dataclass(frozen=True, slots=True)
class Run:
    """One batch on the modelled GPU: when it started and ended (perf_counter), its records' arrivals."""

    start: float
    end: float
    arrivals: tuple[float, ...]


def spin(seconds: float) -> None:
    """Hold the CPU (and the GIL) for `seconds`."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def padded(tokens: int, buckets: Sequence[int]) -> int:
    """The tokens a graph replay computes for a batch of `tokens`: the smallest of `buckets` (ascending)
    that holds it, or the tokens themselves above the largest (run eagerly)."""
    return next((b for b in buckets if b >= tokens), tokens)


@dataclass(slots=True)
class PaddedCost:
    """The batcher's cost model over the tokens a replay computes (`padded`), not the batch's own: what a
    batch of 2,600 tokens costs is its 3,072-token graph's time. `tokens_within` answers a bucket's size
    (a batch cut there pads nothing; every batch up to the smallest bucket costs the same)."""

    buckets: tuple[int, ...]
    inner: CostModel = field(default_factory=CostModel)

    def observe(self, tokens: int, seconds: float) -> None:
        self.inner.observe(padded(tokens, self.buckets), seconds)

    def predict(self, tokens: int) -> float | None:
        return self.inner.predict(padded(tokens, self.buckets))

    def tokens_within(self, seconds: float) -> int | None:
        most = self.inner.tokens_within(seconds)
        if most is None or not self.buckets or most >= self.buckets[-1]:
            return most
        return max([self.buckets[0], *(b for b in self.buckets if b <= most)])


@dataclass(slots=True)
class TimedEngine(RunsWhenLaunched[Sequence[TimedRecord], Sequence[TimedRecord]]):
    """A `ServingEngine` whose GPU is a sleep of `cost.batch_s(tokens)` on the GPU thread; `stage_s` (+
    `stage_record_s` per record) and `respond_record_s` per record spin the CPU. Logs every run.

    `stage_waits_for_run`: staging, after its CPU time, also waits until the batch running on the GPU
    thread (if any) has ended, as the service's device copy was seen to (BENCHMARKS.md, "Priority classes,
    round eight"), so the effect of that wait on the batcher can be read apart from the GPU's."""

    cost: Cost
    stage_s: float
    stage_record_s: float
    respond_record_s: float
    answer: SystemOneResponse
    limits: BatchLimits = SERVICE_LIMITS
    stage_waits_for_run: bool = False
    jitter: float = 0.0
    """Each run's GPU time is the cost times a uniform draw from [1 - jitter, 1 + jitter] (seeded)."""
    buckets: tuple[int, ...] = ()
    """Graph buckets: a run costs its `padded` tokens, as a graph replay computes the whole bucket."""
    launch_ops: int = 0
    """With launches modelled (> 0): the run's GPU time less `head_s` is the decoder's, in the product's
    graph pieces (`engine.model.graphs.graph_pieces` of 48 layers), each launched by one tiny torch call
    (`bench.gil_convoy.launches`: it gives the GIL up and takes it back, as a CUDA launch does) and run
    on the modelled GPU from its launch or the previous piece's end, whichever is later; then the head's
    `launch_ops` launches, and its `head_s` of GPU time after the last of them and the decoder's end."""
    head_s: float = 0.001
    launch_host_s: float = 0.0
    """CPU (holding the GIL) a launch spends before the batch reaches the modelled device: the inputs'
    copies into a graph's buffers and its first launch (round fifteen's trace: 690 us on an H100)."""
    runs: list[Run] = field(default_factory=list)
    _device_end: float = 0.0  # GPU thread only: when the work launched so far ends on the modelled device
    _rng: random.Random = field(default_factory=lambda: random.Random(7))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _idle: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._idle.set()

    def prepare(self, request: SystemOneRequest) -> TimedRecord:
        raise NotImplementedError("the bench submits its own prepare function")

    def stage(self, batch: Sequence[TimedRecord]) -> Sequence[TimedRecord]:
        spin(self.stage_s + self.stage_record_s * len(batch))
        if self.stage_waits_for_run:
            self._idle.wait(10.0)
        return batch

    def run(self, staged: Sequence[TimedRecord], between: Between | None = None) -> Sequence[TimedRecord]:
        return self.launch(staged, between).wait()[0]

    def launch(self, staged: Sequence[TimedRecord], between: Between | None = None) -> _Sleep:
        """Spin `launch_host_s`, then queue the batch on the modelled device: it starts when the work
        launched before it ends, or now (`batching.launch_ahead` launches while the one before runs)."""
        spin(self.launch_host_s)
        start = max(time.perf_counter(), self._device_end)
        self._idle.clear()
        factor = 1.0 + self.jitter * self._rng.uniform(-1.0, 1.0) if self.jitter else 1.0
        tokens = padded(sum(r.num_tokens for r in staged), self.buckets)
        gpu_s = self.cost.batch_s(tokens) * factor
        end = start + gpu_s
        if self.launch_ops:
            decoder_s = max(0.0, gpu_s - self.head_s)
            for a, b in graph_pieces(48):
                launches(1)
                end = max(end if a else start, time.perf_counter()) + decoder_s * (b - a) / 48
            launches(self.launch_ops)
            end = max(end, time.perf_counter()) + self.head_s
        self._device_end = end
        return _Sleep(self, staged, start, end)

    def queues_whole(self, staged: Sequence[TimedRecord]) -> bool:
        """True up to the largest graph bucket (or always, without buckets): a larger batch runs eagerly,
        so the service runs it once the batch ahead has finished (`GpuRunner`)."""
        return not self.buckets or sum(r.num_tokens for r in staged) <= self.buckets[-1]

    def respond(self, ran: Sequence[TimedRecord]) -> list[SystemOneResponse]:
        spin(self.respond_record_s * len(ran))
        return [self.answer] * len(ran)

    def execute(self, batch: Sequence[TimedRecord]) -> list[SystemOneResponse]:
        return self.respond(self.run(self.stage(batch)))

    def out_of_memory(self, exc: BaseException) -> bool:
        return False

    def lane(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()


@dataclass(frozen=True, slots=True)
class _Sleep:
    """A batch launched on `TimedEngine`'s modelled device: `wait` sleeps until its end and logs the run."""

    engine: TimedEngine
    staged: Sequence[TimedRecord]
    start: float
    end: float

    def wait(self) -> tuple[Sequence[TimedRecord], float | None]:
        time.sleep(max(0.0, self.end - time.perf_counter()))
        engine = self.engine
        if engine._device_end <= self.end:
            engine._idle.set()
        with engine._lock:
            engine.runs.append(Run(self.start, time.perf_counter(), tuple(r.arrival for r in self.staged)))
        return self.staged, self.end - self.start


def _ms(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2) if ordered else 0.0


async def drive(
    engine: TimedEngine,
    settings: BatchingSettings,
    schedule: Sequence[tuple[float, int]],
    prepare_s: float,
    metrics: Metrics | None = None,
    cost: CostLike | None = None,
) -> list[float]:
    """Submit each event at its time (one submission each, as HTTP requests and small fetches arrive) and
    return every latency, scheduled arrival to answer, in seconds. `metrics` gets the batcher's; `cost`
    replaces its cost model."""
    batcher: Batcher[TimedRecord, Sequence[TimedRecord], Sequence[TimedRecord]] = Batcher(
        engine, settings, metrics=metrics, cost=cost
    )
    await batcher.start()
    latencies: list[float] = []
    pending: list[asyncio.Future[list[Outcome]]] = []
    t0 = time.perf_counter() + 0.05
    for offset, tokens in schedule:
        at = t0 + offset
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)

        def prepare(n: int, at: float = at) -> TimedRecord:
            spin(prepare_s)
            return TimedRecord(n, at)

        def answered(_: object, at: float = at) -> None:
            latencies.append(time.perf_counter() - at)

        future = batcher.submit(prepare, [tokens])
        future.add_done_callback(answered)
        pending.append(future)
    await asyncio.wait(pending, timeout=60.0)
    await batcher.close()
    return latencies


def path_means(m: Metrics) -> dict[str, float]:
    """Per record, mean ms of each step through the batcher: prepare, queue wait, then the batch's steps
    after the cut (`consumer.batching.gpu.BATCH_STEPS`), from the batcher's metrics."""
    series = {"prepare": m.prepare_seconds, "queue_wait": m.queue_wait}
    out = {name: h.sum / h.count * 1000 if h.count else 0.0 for name, h in series.items()}
    for step in BATCH_STEPS:
        h = m.batch_path.labels(step)
        out[step] = h.sum / h.count * 1000 if h.count else 0.0
    return {k: round(v, 2) for k, v in out.items()}


def cost_error(m: Metrics) -> dict[str, float]:
    """The batcher's cost model against the modelled GPU's run times (`Metrics.batch_cost_error`): the share
    of predicted batches that ran longer than predicted, and the mean error (ms) each way."""
    over, under = (m.batch_cost_error.labels(d) for d in COST_DIRECTIONS)
    predicted = over.count + under.count
    return {
        "over_share": round(over.count / predicted, 3) if predicted else 0.0,
        "over_ms_mean": round(over.sum / over.count * 1000, 2) if over.count else 0.0,
        "under_ms_mean": round(under.sum / under.count * 1000, 2) if under.count else 0.0,
    }


def idle_waiting(runs: Sequence[Run]) -> list[float]:
    """Per batch after the first: GPU idle seconds before it while one of its records had arrived."""
    ordered = sorted(runs, key=lambda r: r.start)
    gaps: list[float] = []
    for before, after in itertools.pairwise(ordered):
        if min(after.arrivals) < before.end:
            gaps.append(max(0.0, after.start - before.end))
    return gaps


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m bench.batcher_model", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--fixed-ms", type=float, default=6.3, help="a: the modelled GPU's cost per batch")
    p.add_argument("--per-record-ms", type=float, default=6.17, help="b: its cost per mean-sized record")
    p.add_argument("--shares", default="0.25,0.7")
    p.add_argument("--events", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--prepare-ms", type=float, default=0.25, help="CPU per record, prepare thread")
    p.add_argument("--stage-ms", type=float, default=0.15, help="CPU per batch, staging")
    p.add_argument("--stage-record-ms", type=float, default=0.05, help="CPU per record, staging")
    p.add_argument("--respond-record-ms", type=float, default=0.05, help="CPU per record, responding")
    p.add_argument(
        "--stage-waits-for-run", action="store_true", help="staging also waits for the running batch's end"
    )
    p.add_argument("--jitter", type=float, default=0.0, help="each GPU run's time varies by up to this share")
    p.add_argument("--set", action="append", default=[], help="a BatchingSettings field, name=value (JSON)")
    p.add_argument(
        "--graph-buckets", action="store_true", help="the GPU pads each run to the engine's graph buckets"
    )
    p.add_argument("--pad-cost", action="store_true", help="the batcher's cost model pads to them too")
    p.add_argument(
        "--launch-ops", type=int, default=0, help="GIL round trips (tiny torch calls) at each run's start"
    )
    p.add_argument(
        "--switch-interval-ms", type=float, default=None, help="the GIL switch interval (default: Python's 5)"
    )
    p.add_argument("--launch-host-ms", type=float, default=0.0, help="CPU each launch spends before the GPU")
    args = p.parse_args(argv)
    configure_logging("warning")
    if args.switch_interval_ms is not None:
        set_switch_interval(args.switch_interval_ms)  # as the service sets its setting
    cost = Cost(args.fixed_ms / 1000, args.per_record_ms / 1000, mix_mean())
    buckets: tuple[int, ...] = ()
    if args.graph_buckets or args.pad_cost:
        from engine.model.graphs import GRAPH_BUCKETS

        buckets = GRAPH_BUCKETS
    capacity = 1000.0 / args.per_record_ms
    overrides = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
    settings = BatchingSettings(**overrides)
    request = parse_request(
        {"state": "disk full", "questions": {"outage": {"type": "noul", "instructions": "?"}}}
    )
    answer = StubEngine().execute([StubEngine().prepare(request)])[0]
    print(
        json.dumps(
            {
                "kind": "cost",
                "fixed_ms": args.fixed_ms,
                "per_record_ms": args.per_record_ms,
                "capacity": round(capacity, 1),
                "settings": overrides,
                "stage_waits_for_run": args.stage_waits_for_run,
                "jitter": args.jitter,
                "graph_buckets": args.graph_buckets,
                "pad_cost": args.pad_cost,
                "launch_ops": args.launch_ops,
                "launch_host_ms": args.launch_host_ms,
                "switch_interval_ms": round(sys.getswitchinterval() * 1000, 3),
            }
        ),
        flush=True,
    )
    for share in (float(s) for s in args.shares.split(",")):
        rate = share * capacity
        schedule = [(at, round(tokens)) for at, tokens in poisson_arrivals(rate, args.events, args.seed)]
        engine = TimedEngine(
            cost,
            args.stage_ms / 1000,
            args.stage_record_ms / 1000,
            args.respond_record_ms / 1000,
            answer,
            stage_waits_for_run=args.stage_waits_for_run,
            jitter=args.jitter,
            buckets=buckets if args.graph_buckets else (),
            launch_ops=args.launch_ops,
            launch_host_s=args.launch_host_ms / 1000,
        )
        metrics = Metrics()
        model_cost = PaddedCost(buckets) if args.pad_cost else None
        latencies = asyncio.run(
            drive(engine, settings, schedule, args.prepare_ms / 1000, metrics, model_cost)
        )
        gaps = idle_waiting(engine.runs)
        span = max(r.end for r in engine.runs) - min(r.start for r in engine.runs)
        busy = sum(r.end - r.start for r in engine.runs)
        to_end = [r.end - at for r in engine.runs for at in r.arrivals]  # the model's latency
        model = simulate(cost, rate, args.events, seed=args.seed)
        row = {
            "kind": "share",
            "share": share,
            "rate": round(rate, 1),
            "answered": len(latencies),
            "p50_ms": _ms(latencies, 0.5),
            "p99_ms": _ms(latencies, 0.99),
            "max_ms": _ms(latencies, 1.0),
            "to_gpu_end_p50_ms": _ms(to_end, 0.5),
            "to_gpu_end_p99_ms": _ms(to_end, 0.99),
            "records_per_batch": round(sum(len(r.arrivals) for r in engine.runs) / len(engine.runs), 2),
            "run_ms_p50": _ms([r.end - r.start for r in engine.runs], 0.5),
            "run_ms_p90": _ms([r.end - r.start for r in engine.runs], 0.9),
            "gpu_busy": round(busy / span, 3),
            "idle_waiting_ms_mean": round(statistics.fmean(gaps) * 1000, 2) if gaps else 0.0,
            "idle_waiting_ms_p50": _ms(gaps, 0.5),
            "batches_after_a_wait": len(gaps),
            "batches": len(engine.runs),
            "path_ms_mean": path_means(metrics),
            "cost_error": cost_error(metrics),
            "model": model,
        }
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
