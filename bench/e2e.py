"""`python3 -m bench.e2e`: the whole service end to end through a real Apache Kafka broker, at fixed rates.

One process, one run (a benchmark program, not a test; nothing here asserts a speed):

1. a local single-node broker (`devtools.kafka_local.LocalKafka`, loopback only) starts in a helper thread
   while the engine is built: `--engine full` (default with CUDA) the full-size Clef-omni thinker and joint
   head with random bf16 weights (`bench.workload.build_engine`, fast path and CUDA graphs, as `bench.load`;
   `--layers N` builds fewer decoder layers for a quick probe), `tiny` the tiny release on CPU, `stub`
   `devtools.stub.StubEngine` (answers at once: the Kafka side alone);
2. a pool of distinct SystemOne requests with `bench.load`'s mix (target lengths 40% 200-500 tokens, 40%
   500-1,000, 20% 1,000-1,500; 3 questions each; sized with the tiny release's tokenizer), sent as JSON
   record values;
3. the engine-only figure of the same process: `bench.load_run.capacity`, a backlog through the service's
   batcher at the pipeline's batching settings, no Kafka (after a warm-up batch run, as `bench.load`);
4. the service's topics (`consumer.settings` defaults: `alerts.in`, `decisions`, `route.*`, `alerts.dlq`)
   created with `--partitions`; the real `consumer.pipeline.pipeline.Pipeline` (at-least-once, the default
   settings except the broker address, a fresh group and the HTTP API off) runs in this process's event loop;
5. a producer (acks=all, idempotent, `linger.ms` 5 or `--producer-linger-ms`: an event waits in it up to
   that long, and the wait is part of every latency below) sends events at a fixed rate (`--arrivals
   uniform`, or Poisson) for a warm-up (`--warmup-s`) and then for `--seconds` at each of `--rate` (with
   `--shares`, each a share of step 3's events/s), one after another, each followed by a drain until
   every event of the load is decided (at most `--drain-s`);
6. a tail consumer reads `decisions` and `alerts.dlq`: latency counts from each event's scheduled send time
   (so a producer that falls behind shows up as latency) to the moment the tail consumer holds its decision
   (`ce_id` header, kept by the router); the record-timestamp latency (decision CreateTime minus the input's
   CreateTime, which the producer sets to the scheduled time) is given beside it;
7. a lag sampler, once a second: the input partitions' high watermarks (ListOffsets) against the group's
   committed offsets (OffsetFetch), plus produced, decided and in-flight counts.

`--mixed` replaces steps 4-5 and the loads with the mixed run (`bench.e2e_mixed`): inputs `alerts.in` and
`alerts.critical` (priority class 1) and the HTTP API on loopback; a backlog of `--backlog-s` seconds of
work on `alerts.in` (at the engine-only figure, or at `--bulk-rate` without one), then for `--seconds`
`alerts.in` at `--bulk-rate` (default 1.2 x engine-only), `alerts.critical` at `--critical-rate` and HTTP
requests at `--http-rate` (both Poisson); then one `mixed` line and its table (per class p50/p95/p99, the
Kafka throughput meanwhile, the ledger per topic, the committed offsets after the drain, the event loop's
lag with its worst wake-ups). A rate may repeat (`--rate 113,113,113`: three loads at one rate, the spread of
one code between runs).

Environment, for experiments: `BENCH_E2E_LOG_LEVEL` (default `warning`; `info` keeps the batcher's line per
batch, where an urgent batch's line says where its time went), `BENCH_E2E_SWITCH_INTERVAL_MS` (the GIL
switch interval of the process, which the pipeline's `gil_switch_interval_ms` then keeps; Python's 5 ms when
unset), `BENCH_E2E_STAGE_PROBE` (1: `bench.stage_probe`
times `Engine.stage` and its device copy, and `Engine.run` split into the launch and the wait for the GPU,
wall and thread CPU, printed at exit; with it, `BENCH_E2E_GIL_PROBE_MS` starts the probe's GIL sampler at
that period, 2 suggested) and
`BENCH_E2E_LAYERS_AHEAD` (how many layers of an eager forward the launch pacer keeps queued on the GPU; the
decoder's 3 when unset; the info line says it) and
`BENCH_E2E_GRAPH_TO` (CUDA graphs for the buckets up to this many tokens, `bench.batch_sizes.buckets_to`:
4096 is the default before round five of the priority benches; unset: the product's default buckets).

Writes `e2e.jsonl` (every line: info, capacity, lag samples, one `load` line per rate or the `backlog` and
`mixed` lines, done), `e2e.txt` (the summary table) and `broker.log` (the broker's WARN+ log) to `--out`
(default `$OUT` or `bench-out/`), and prints the JSON lines and the table. Ctrl-C / SIGTERM: the current
load stops, the pipeline drains, the broker stops. The wall time is bounded by `--deadline-s` (loads that
would not fit are skipped).

On the GPU machine it runs through `scripts/device-e2e.sh`, which unpacks the carried JRE, broker jars and
wheels; it installs nothing itself. Without PyAV (too large to carry), a placeholder `av` module lets the
engine package import: these events carry no media, so PyAV is never called.

This module is the command (options, the run from broker start to summary); the events and the producer are
in `bench.e2e_traffic`, steps 4-7 in `bench.e2e_run`, the figures and the table in `bench.e2e_report`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.av_placeholder import install_av_placeholder
from bench.cli import parse_sets
from bench.e2e_mixed import MixedPlan, mixed_batching, mixed_run, mixed_sizes
from bench.e2e_report import Emit, broker_log_errors, mixed_text, summary_text
from bench.e2e_run import FP8_MODES, Plan, build_engines, kafka_run
from bench.e2e_traffic import LINGER_MS, event_values
from bench.routing import ROUTINGS

if TYPE_CHECKING:
    from devtools.kafka_local import LocalKafka

__all__ = ["add_arguments", "install_av_placeholder", "main", "run"]  # the placeholder: scripts/device-*.sh


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `bench.e2e`."""
    p.add_argument("--out", default=None, help="output folder (default: $OUT or bench-out/)")
    p.add_argument("--engine", choices=("auto", "full", "tiny", "stub"), default="auto",
                   help="auto: full with CUDA, else tiny")  # fmt: skip
    p.add_argument("--layers", type=int, default=None, help="full: decoder layers (default 48)")
    p.add_argument(
        "--routing", choices=ROUTINGS, default="levelled", help="full: routers levelled (default) or random"
    )
    p.add_argument(
        "--fp8", choices=tuple(FP8_MODES), default="off", help="full: FP8 experts, or experts and attention"
    )
    p.add_argument(
        "--lane-stream",
        choices=("on", "off"),
        default="off",
        help="full: urgent batches on the engine's high-priority CUDA stream (engine.lane_stream) or not",
    )
    p.add_argument(
        "--sm90",
        action="store_true",
        help="full, with --fp8: the FP8 experts of large batches through the sm_90a CUDA cluster kernels "
        "(engine.kernels.moe_fp8_sm90, as the service's engine.sm90_experts; nvcc and ninja needed)",
    )
    p.add_argument("--rate", default="25,50,75,90", help="events/s, one load per value, comma-separated")
    p.add_argument(
        "--shares",
        action="store_true",
        help="--rate gives shares of the engine-only capacity measured first (needs --capacity-events); the "
        "warm-up runs at the first load's rate",
    )
    p.add_argument("--seconds", type=float, default=60.0, help="send window per load")
    p.add_argument("--warmup-s", type=float, default=10.0, help="send window before the loads (first rate)")
    p.add_argument("--drain-s", type=float, default=60.0, help="bound on the drain after each load")
    p.add_argument("--arrivals", choices=("uniform", "poisson"), default="uniform")
    p.add_argument("--partitions", type=int, default=3, help="partitions of every topic")
    p.add_argument(
        "--mode", choices=("fixed", "adaptive"), default=None, help="batching mode (default: the service's)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a batching or kafka setting of the run, e.g. batching.backlog_batches=2 (repeatable, JSON)",
    )
    p.add_argument(
        "--max-batch-tokens", type=int, default=None, help="batch token budget (default: the service's)"
    )
    p.add_argument("--pool", type=int, default=256, help="distinct events")
    p.add_argument(
        "--producer-linger-ms", type=int, default=LINGER_MS,
        help="the load producer's linger.ms (part of every latency; the loads, not --mixed)",
    )  # fmt: skip
    p.add_argument(
        "--capacity-events", type=int, default=1024, help="backlog of the engine-only figure (0: skip)"
    )
    p.add_argument("--deadline-s", type=float, default=400.0, help="no load starts after this many s of run")
    p.add_argument("--mixed", action="store_true", help="the mixed run instead of the loads (see above)")
    p.add_argument("--backlog-s", type=float, default=12.0, help="mixed: seconds of work queued first")
    p.add_argument(
        "--bulk-rate", type=float, default=None, help="mixed: alerts.in events/s (default 1.2 x engine-only)"
    )
    p.add_argument("--critical-rate", type=float, default=2.0, help="mixed: alerts.critical events/s")
    p.add_argument("--http-rate", type=float, default=2.0, help="mixed: HTTP requests/s")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the command line) and run; returns 0 (2 when the run stopped on an error
    before any load finished)."""
    p = argparse.ArgumentParser(prog="bench.e2e", description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(p)
    return run(p.parse_args(argv))


def _sigterm_interrupts() -> None:
    """SIGTERM outside the Kafka part raises KeyboardInterrupt, so `finally` stops the broker (its JVM runs
    in its own session and would outlive a plain termination)."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def run(args: argparse.Namespace) -> int:
    """The whole run (see the module docstring) with parsed options."""
    t_start = time.perf_counter()
    _sigterm_interrupts()
    av_placeholder = install_av_placeholder()
    if os.environ.get("BENCH_E2E_STAGE_PROBE"):  # where Engine.stage spends its time (bench.stage_probe)
        import atexit

        from bench import stage_probe

        gil_ms = os.environ.get("BENCH_E2E_GIL_PROBE_MS")  # the probe's GIL sampler, every that many ms
        stage_probe.install(None if not gil_ms else float(gil_ms) / 1000.0)
        atexit.register(lambda: print("stage_probe", json.dumps(stage_probe.summary()), file=sys.stderr))
    import torch

    from bench.load import MIX, _version, make_pool
    from bench.load_run import capacity
    from consumer.settings import BatchingSettings
    from devtools.kafka_local import LocalKafka

    out = Path(args.out or os.environ.get("OUT") or "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    sink = (out / "e2e.jsonl").open("w")

    def emit(**fields: Any) -> None:
        line = json.dumps(fields)
        print(line, flush=True)
        sink.write(line + "\n")
        sink.flush()

    kind = args.engine if args.engine != "auto" else ("full" if torch.cuda.is_available() else "tiny")
    overrides = {
        k: v for k, v in (("mode", args.mode), ("max_batch_tokens", args.max_batch_tokens)) if v is not None
    }
    sets = parse_sets(args.set)
    if set(sets) - {"batching", "kafka"}:
        raise SystemExit(f"bench.e2e: --set takes batching and kafka settings only, got {sorted(set(sets))}")
    overrides |= sets.get("batching", {})
    batching = BatchingSettings.model_validate(overrides).model_dump()
    if args.mixed:
        batching = mixed_batching(batching)
        _sizes(args, None if kind == "stub" or args.capacity_events <= 0 else 1.0)  # fail before the build
    rates = tuple(float(x) for x in args.rate.split(","))
    if not rates or any(r <= 0 or not math.isfinite(r) for r in rates):
        raise SystemExit("bench.e2e: --rate needs positive numbers")
    if args.sm90 and (kind != "full" or args.fp8 == "off"):
        raise SystemExit("bench.e2e: --sm90 needs the full engine and an --fp8 mode (FP8 expert kernels)")
    if args.shares and (args.mixed or kind == "stub" or args.capacity_events <= 0):
        raise SystemExit("bench.e2e: --shares needs the engine-only capacity (--capacity-events, no --mixed)")
    broker = LocalKafka()
    code = 2
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="e2e-broker") as pool:
            started = pool.submit(broker.start)  # the JVM starts while the model is built
            t0 = time.perf_counter()
            engine, sizing = build_engines(
                kind,
                args.layers,
                batching["max_batch_tokens"],
                args.routing,
                args.fp8,
                lane_stream=args.lane_stream == "on",
                sm90=args.sm90,
            )
            build_s = time.perf_counter() - t0
            ahead = _layers_ahead(engine)
            requests = make_pool(sizing, random.Random(0), args.pool)
            lengths = sorted(sizing.prepare(r).num_tokens for r in requests)
            started.result(timeout=180)
        values = event_values(requests)
        info = {
            "kind": "info",
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "engine": kind if args.layers is None or kind != "full" else f"full ({args.layers} layers)",
            "routing": args.routing if kind == "full" else None,
            "fp8": args.fp8 if kind == "full" else None,
            "lane_stream": args.lane_stream if kind == "full" else None,
            "sm90": args.sm90 if kind == "full" else None,
            "layers_ahead": ahead,
            "producer_linger_ms": args.producer_linger_ms,
            "switch_interval_ms": round(sys.getswitchinterval() * 1000.0, 3),  # the pipeline keeps it
            "graph_to": int(os.environ.get("BENCH_E2E_GRAPH_TO", "0")) or None,  # None: default buckets
            "device": torch.cuda.get_device_name() if kind == "full" else "cpu",
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "aiokafka": _version("aiokafka"),
            "python": sys.version.split()[0],
            "java": os.path.realpath(shutil.which("java") or "java"),
            "broker_version": broker.broker_version,
            "broker_ready_s": round(broker.ready_seconds or 0.0, 2),
            "build_s": round(build_s, 1),
            "av_placeholder": av_placeholder,
            "mix": [list(m) for m in MIX],
            "tokens_min": lengths[0],
            "tokens_p50": lengths[len(lengths) // 2],
            "tokens_mean": round(statistics.mean(lengths), 1),
            "tokens_max": lengths[-1],
            "value_bytes_mean": round(statistics.mean(len(v) for v in values)),
            "rates": list(rates),
            "rates_are_shares": args.shares,
            "seconds_per_load": args.seconds,
            "warmup_s": args.warmup_s,
            "arrivals": args.arrivals,
            "partitions": args.partitions,
            "batching": batching,
        }
        if args.mixed:
            info["mixed"] = {
                "backlog_s": args.backlog_s,
                "bulk_rate": args.bulk_rate,
                "critical_rate": args.critical_rate,
                "http_rate": args.http_rate,
            }
        emit(**info)
        cap: dict[str, Any] | None = None
        if kind != "stub" and args.capacity_events > 0:
            asyncio.run(capacity(engine, requests[:64], batching))  # warm-up: first launches, graph captures
            backlog = [requests[i % len(requests)] for i in range(args.capacity_events)]
            cap = asyncio.run(capacity(engine, backlog, batching))
            emit(kind="capacity", mode=batching["mode"], max_batch_tokens=batching["max_batch_tokens"], **cap)
        if os.environ.get("BENCH_E2E_STAGE_PROBE"):  # the probe's figures: the Kafka phase only
            from bench import stage_probe

            stage_probe.reset()
            emit(kind="note", t=round(time.perf_counter() - t_start, 2), message="stage probe reset")
        if args.mixed:
            line = _mixed(args, broker, engine, values, batching, cap, t_start, emit)
            loads = [line] if line is not None else []
            text = mixed_text(info, cap, line) if line is not None else "bench.e2e --mixed: no mixed run\n"
        else:
            if args.shares and cap is not None:  # the loads' events/s: shares of the figure just measured
                rates = tuple(round(share * float(cap["events_s"]), 2) for share in rates)
                emit(kind="note", t=round(time.perf_counter() - t_start, 2), message=f"rates {list(rates)}/s")
            plan = Plan(
                rates=rates,
                seconds=args.seconds,
                warmup_s=args.warmup_s,
                drain_s=args.drain_s,
                poisson=args.arrivals == "poisson",
                partitions=args.partitions,
                batching=batching,
                deadline=t_start + args.deadline_s,
                kafka=sets.get("kafka", {}),
                linger_ms=args.producer_linger_ms,
            )
            loads = asyncio.run(kafka_run(broker, engine, values, plan, t_start, emit))
            text = summary_text(info, cap, loads)
        _sigterm_interrupts()  # the event loop's handlers are gone with it
        errors = broker_log_errors(broker)
        (out / "e2e.txt").write_text(text, encoding="utf-8")
        print(text, flush=True)
        emit(kind="done", total_s=round(time.perf_counter() - t_start, 1), loads=len(loads),
             broker_missing_class_lines=errors)  # fmt: skip
        code = 0 if loads else 2
    finally:
        with contextlib.suppress(Exception):
            (out / "broker.log").write_bytes(broker.log_file.read_bytes()[-4_000_000:])
        broker.stop()
        sink.close()
    return code


def _layers_ahead(engine: Any) -> int | None:
    """The fast decoder's launch pacer depth (`engine.model.decoder.PackedTextDecoder.layers_ahead`), set
    from `BENCH_E2E_LAYERS_AHEAD` first when that is given (an experiment); None without a fast decoder."""
    fast = getattr(getattr(engine, "model", None), "_fast", None)
    if fast is None:
        return None
    if os.environ.get("BENCH_E2E_LAYERS_AHEAD"):
        fast.layers_ahead = int(os.environ["BENCH_E2E_LAYERS_AHEAD"])
    return int(fast.layers_ahead)


def _sizes(args: argparse.Namespace, engine_only: float | None) -> tuple[int, float]:
    """`mixed_sizes` of the options; raises `SystemExit` for options that cannot make a mixed run."""
    if args.critical_rate < 0 or args.http_rate < 0:
        raise SystemExit("bench.e2e: --critical-rate and --http-rate must be 0 or more")
    try:
        return mixed_sizes(engine_only, args.backlog_s, args.bulk_rate)
    except ValueError as exc:
        raise SystemExit(f"bench.e2e: {exc}") from None


def _mixed(
    args: argparse.Namespace,
    broker: LocalKafka,
    engine: Any,
    values: Sequence[bytes],
    batching: dict[str, Any],
    cap: dict[str, Any] | None,
    t_start: float,
    emit: Emit,
) -> dict[str, Any] | None:
    """The mixed run (`bench.e2e_mixed`) with parsed options; its `mixed` line, None when it did not run."""
    engine_only = float(cap["events_s"]) if cap else None
    backlog, bulk_rate = _sizes(args, engine_only)
    plan = MixedPlan(
        backlog_events=backlog,
        bulk_rate=bulk_rate,
        critical_rate=args.critical_rate,
        http_rate=args.http_rate,
        seconds=args.seconds,
        drain_s=args.drain_s,
        poisson=args.arrivals == "poisson",
        partitions=args.partitions,
        batching=batching,
        engine_only_s=engine_only,
        deadline=t_start + args.deadline_s,
    )
    return asyncio.run(mixed_run(broker, engine, values, plan, t_start, emit))


if __name__ == "__main__":
    from consumer.logging import configure_logging

    # the batcher logs a line per batch at info (an urgent one with its lane times): BENCH_E2E_LOG_LEVEL=info
    configure_logging(os.environ.get("BENCH_E2E_LOG_LEVEL", "warning"))
    if os.environ.get("BENCH_E2E_SWITCH_INTERVAL_MS"):  # an experiment's GIL switch interval (default 5 ms)
        from consumer.runtime import set_switch_interval

        set_switch_interval(float(os.environ["BENCH_E2E_SWITCH_INTERVAL_MS"]))
    raise SystemExit(main())
