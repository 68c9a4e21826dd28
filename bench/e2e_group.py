"""`python3 -m bench.e2e_group`: N service processes in one consumer group through a real broker, and kill -9.

Scale-out as Kafka users do it: one `clef-router run` process per GPU (`CLEF_ENGINE__DEVICE_INDEX`), all in
one group on one input topic with `--partitions` (12) partitions. A benchmark program, not a test:

1. a local single-node broker (`devtools.kafka_local.LocalKafka`, loopback) and a pool of distinct SystemOne
   events (`bench.load`'s length mix, sized with the tiny release's tokenizer, which the benchmark release
   shares);
2. `--processes` children (`python -m bench.service_main run`, `bench.children`), started one after the
   other (each waits for the previous one's `/readyz`: two engines loading at once would double the load's
   peak memory), each with its own HTTP port on loopback and `CLEF_*` settings of its own (nothing of the
   caller's `CLEF_*` environment leaks in). Engines (`--engine`): `stub` (`--stub-engine`, answers at
   once: the Kafka side alone), `tiny` (the tiny release on CPU), `release` (`--release DIR` on CUDA,
   bf16, process i on GPU i mod `--gpus`; `--fp8 experts|text-only`). For levelled routing (what a trained
   router does) the release's routers are levelled first (`bench.level_release`); the random release's
   routers send most tokens of a layer to one expert;
3. `--scenario steady`: a warm-up; with `--capacity-events N` a backlog of N events sent at once, whose drain
   rate (decided events over the seconds from the first send to the last decision) is the group's capacity
   through Kafka (one `capacity` line; `--shares`: the rates are shares of it); then each `--rate` for
   `--seconds` (open loop, `--arrivals`), each followed by a drain; one `load` line per rate (events in and
   out per second, latency p50/p99 from each event's scheduled send time to the moment the tail consumer
   holds its decision);
4. `--scenario fault`: for each mode in `--modes` (`alo` at-least-once, `eos` exactly-once: the children's
   `kafka.exactly_once`, the tail reads committed records only), fresh topics and group, the fleet, then
   one rate for `--seconds`; at `--kill-at-s` the last process is killed with SIGKILL (its process group),
   and started again after `--restart-after-s`; one `fault` line per mode (`bench.e2e_group_report`): the
   ledger (sent, decided, dead-lettered, lost, duplicates), the killed process's partitions, the seconds
   from the kill until a survivor was assigned them and until the first decision of an event sent to them
   after the kill, the restarted process's seconds from spawn to ready, to its assignment and to its first
   decision, and the decisions per second around the kill.

The group's `kafka.session_timeout_ms` is `--session-timeout-ms` (default 10,000, the coordinator's wait for a
dead member: the survivor cannot take the partitions sooner). Where `nvidia-smi` runs, each child's GPU memory
is sampled once a second (peak per process in every line). Writes `group.jsonl` (every line), `group.txt`
(the summary) and `children.log` (the tail of every child's stderr) to `--out` (default `$OUT` or
`bench-out/`). Ctrl-C / SIGTERM: the children are stopped (SIGTERM, then SIGKILL), the broker stops, the
temporary tiny release is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.children import Child, http_get, kill, spawn, stop, wait_ready
from bench.e2e_group_report import (
    EOS_MODES,
    FaultClock,
    assignment,
    capacity_figures,
    fault_figures,
    first_holding,
    service_window,
    steady_figures,
    summary_text,
)
from bench.e2e_traffic import Ledger, Producer, Tail

Emit = Callable[..., None]
READY_LIMIT_S = 300.0
SETTLE_LIMIT_S = 90.0
#: Every child spawned by this process (appended by `Fleet.start` only): `main`'s last step kills any that
#: is still alive, whatever stopped the run (a start thread that outlived its cancelled task included).
_SPAWNED: list[Child] = []


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """How every child of a run is started: its engine and the settings common to all of them."""

    engine: str  # stub | tiny | release
    model_path: Path | None
    gpus: int
    fp8: str  # off | experts | text-only
    session_timeout_ms: int
    extra_env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Topics:
    """The topics of one scenario run (a fresh prefix each) and its group."""

    prefix: str

    @property
    def input(self) -> str:
        return f"{self.prefix}.in"

    @property
    def decisions(self) -> str:
        return f"{self.prefix}.decisions"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}.dlq"

    @property
    def group(self) -> str:
        return f"{self.prefix}.g"

    def env(self) -> dict[str, str]:
        """The children's topic and group settings."""
        return {
            "CLEF_KAFKA__GROUP_ID": self.group,
            "CLEF_TOPICS__INPUT": json.dumps([self.input]),
            "CLEF_TOPICS__DECISIONS": self.decisions,
            "CLEF_TOPICS__ROUTE_PREFIX": f"{self.prefix}.route.",
            "CLEF_TOPICS__REVIEW": f"{self.prefix}.route.review",
            "CLEF_TOPICS__UNROUTED": f"{self.prefix}.route.unrouted",
            "CLEF_TOPICS__DLQ": self.dlq,
        }

    def names(self) -> list[str]:
        """Every topic the children read or write."""
        from consumer.kafka.access import service_topics
        from consumer.settings import load_settings

        env = self.env()
        settings = load_settings(
            topics={
                "input": [self.input],
                "decisions": self.decisions,
                "route_prefix": env["CLEF_TOPICS__ROUTE_PREFIX"],
                "review": env["CLEF_TOPICS__REVIEW"],
                "unrouted": env["CLEF_TOPICS__UNROUTED"],
                "dlq": self.dlq,
            }
        )
        return service_topics(settings.topics, settings.routing.department_map.values())


class Fleet:
    """The children of one scenario run: started, killed and stopped by this object only (blocking
    methods: call them from a thread). `children[i]` is slot i's current process (a restart replaces it);
    `retired` keeps the replaced ones for their logs."""

    def __init__(self, spec: ChildSpec, bootstrap: str, topics: Topics, exactly_once: bool) -> None:
        self._spec = spec
        self._bootstrap = bootstrap
        self._topics = topics
        self._exactly_once = exactly_once
        self.children: list[Child] = []
        self.ports: list[int] = []
        self.retired: list[Child] = []

    def _env(self, slot: int, port: int) -> dict[str, str]:
        spec = self._spec
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLEF_")}
        env.update(self._topics.env())
        env.update(
            CLEF_KAFKA__BOOTSTRAP_SERVERS=self._bootstrap,
            CLEF_KAFKA__SESSION_TIMEOUT_MS=str(spec.session_timeout_ms),
            CLEF_KAFKA__EXACTLY_ONCE="true" if self._exactly_once else "false",
            CLEF_HTTP__HOST="127.0.0.1",
            CLEF_HTTP__PORT=str(port),
            CLEF_LOG_LEVEL="info",  # partitions_assigned lines: the fault figures read them
            PYTHONUNBUFFERED="1",
        )
        if spec.engine != "stub":
            assert spec.model_path is not None
            env["CLEF_ENGINE__MODEL_PATH"] = str(spec.model_path)
        if spec.engine == "tiny":
            env.update(CLEF_ENGINE__DEVICE="cpu", CLEF_ENGINE__DTYPE="float32")
        if spec.engine == "release":
            env.update(
                CLEF_ENGINE__DEVICE="cuda",
                CLEF_ENGINE__DEVICE_INDEX=str(slot % max(1, spec.gpus)),
                CLEF_ENGINE__DTYPE="bfloat16",
                CLEF_ENGINE__FP8_EXPERTS="true" if spec.fp8 == "experts" else "false",
                CLEF_ENGINE__FP8_TEXT_ONLY="true" if spec.fp8 == "text-only" else "false",
            )
        env.update(dict(spec.extra_env))
        return env

    def start(self, slot: int) -> float:
        """Start slot `slot`'s process (replacing a dead one) and wait for its `/readyz`; returns seconds
        from spawn to ready."""
        from devtools.kafka_local import free_port

        port = free_port()
        args = ["run", "--stub-engine"] if self._spec.engine == "stub" else ["run"]
        child = spawn(args, self._env(slot, port))
        _SPAWNED.append(child)
        if slot < len(self.children):
            self.retired.append(self.children[slot])
            self.children[slot], self.ports[slot] = child, port
        else:
            self.children.append(child)
            self.ports.append(port)
        return wait_ready(child, port, READY_LIMIT_S)

    def kill(self, slot: int) -> None:
        """kill -9 slot `slot`'s process group and reap it."""
        kill(self.children[slot])

    def stop_all(self) -> None:
        """SIGTERM every live child (drain, commit, leave the group), SIGKILL after 40 s each."""
        for child in reversed(self.children):
            stop(child, 40.0)

    def check_alive(self, except_slot: int | None = None) -> None:
        """Raise `RuntimeError` when a child other than `except_slot` exited on its own."""
        for slot, child in enumerate(self.children):
            if slot != except_slot and child.proc.poll() is not None:
                tail = "\n".join(line for _, line in child.lines[-10:])
                raise RuntimeError(f"child {slot} exited with {child.proc.returncode}:\n{tail}")

    def log_tail(self, lines: int = 200) -> str:
        """The last `lines` stderr lines of every child, retired ones included, each under a header."""
        out = []
        for child in [*self.retired, *self.children]:
            out.append(f"==== pid {child.proc.pid} (exit {child.proc.poll()}) ====")
            out += [f"{t:9.2f} {line[:400]}" for t, line in child.lines[-lines:]]
        return "\n".join(out) + "\n"


class GpuMemory:
    """Peak GPU memory sampled once a second with `nvidia-smi` (nothing without it): per process id, and
    per GPU in all (a container's process ids may not be the ones `nvidia-smi` reports)."""

    def __init__(self) -> None:
        self.peak_mib: dict[int, int] = {}
        self.gpu_peak_mib: dict[int, int] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if shutil.which("nvidia-smi"):
            self._task = asyncio.create_task(self._loop(), name="group-gpu-memory")

    @staticmethod
    async def _query(*args: str) -> list[tuple[int, int]]:
        """`nvidia-smi ARGS` CSV rows of two integers (rows that are not are skipped)."""
        proc = await asyncio.create_subprocess_exec(
            "nvidia-smi", *args, "--format=csv,noheader,nounits",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        out, _ = await proc.communicate()
        rows = []
        for row in out.decode().splitlines():
            key, _, value = row.partition(",")
            with contextlib.suppress(ValueError):
                rows.append((int(key), int(value)))
        return rows

    async def _loop(self) -> None:
        while True:
            for pid, mib in await self._query("--query-compute-apps=pid,used_memory"):
                self.peak_mib[pid] = max(self.peak_mib.get(pid, 0), mib)
            for index, mib in await self._query("--query-gpu=index,memory.used"):
                self.gpu_peak_mib[index] = max(self.gpu_peak_mib.get(index, 0), mib)
            await asyncio.sleep(1.0)

    def of(self, children: Sequence[Child]) -> list[int | None]:
        """Peak MiB of each child (None: never seen)."""
        return [self.peak_mib.get(c.proc.pid) for c in children]

    def gpus(self) -> list[int]:
        """Peak MiB used on each GPU (index order) since `start`."""
        return [self.gpu_peak_mib[i] for i in sorted(self.gpu_peak_mib)]

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


#: The service metrics each child's `/metrics` is read for (`service_window` in `bench.e2e_group_report`).
SCRAPED = (
    "clef_router_gpu_busy_seconds_total",
    "clef_router_batch_records_count",
    "clef_router_batch_records_sum",
    "clef_router_batch_tokens_sum",
)


def scrape(port: int) -> dict[str, float] | None:
    """`SCRAPED` from `http://127.0.0.1:port/metrics` plus the monotonic time of the read (`at`); None when
    the child does not answer. Blocking."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=5.0)
    if status != 200:
        return None
    values = {name: 0.0 for name in SCRAPED}
    for family in text_string_to_metric_families(body.decode("utf-8", "replace")):
        for sample in family.samples:
            if sample.name in values and not sample.labels:
                values[sample.name] = float(sample.value)
    values["at"] = time.monotonic()
    return values


async def _scrape_all(fleet: Fleet) -> list[dict[str, float] | None]:
    """`scrape` of every child, in a thread each."""
    return list(await asyncio.gather(*(asyncio.to_thread(scrape, port) for port in fleet.ports)))


async def _settled(fleet: Fleet, partitions: int, since: float) -> float:
    """Wait until every live child logged an assignment after `since` (monotonic) and together they hold
    each input partition exactly once; returns the monotonic time it was seen. Raises `TimeoutError`."""
    deadline = time.monotonic() + SETTLE_LIMIT_S
    while time.monotonic() < deadline:
        fleet.check_alive()
        latest = [assignment(c, since) for c in fleet.children]
        held = [p for a in latest if a is not None for p in a[1]]
        if all(a is not None for a in latest) and sorted(held) == list(range(partitions)):
            return time.monotonic()
        await asyncio.sleep(0.1)
    raise TimeoutError(f"the group did not settle on {partitions} partitions in {SETTLE_LIMIT_S:.0f} s")


async def _taken(survivors: Sequence[Child], orphaned: Sequence[int], kill_mono: float) -> float | None:
    """Wait (at most `SETTLE_LIMIT_S`) until the survivors' assignments since the kill cover `orphaned`;
    the monotonic time they did, or None."""
    deadline = time.monotonic() + SETTLE_LIMIT_S
    while time.monotonic() < deadline:
        covered = first_holding(survivors, orphaned, kill_mono)
        if covered is not None:
            return covered
        await asyncio.sleep(0.1)
    return None


async def _drain(ledger: Ledger, loads: set[int], limit_s: float) -> float:
    """Wait until every event of `loads` is decided or dead-lettered (at most `limit_s`); returns seconds."""
    began = time.perf_counter()
    ids = [eid for eid, s in ledger.sent.items() if s.load in loads]
    while time.perf_counter() - began < limit_s:
        if all(eid in ledger.decided or eid in ledger.dead for eid in ids):
            break
        await asyncio.sleep(0.05)
    return round(time.perf_counter() - began, 2)


@dataclass(frozen=True, slots=True)
class Run:
    """The options of one invocation that the scenarios read."""

    spec: ChildSpec
    processes: int
    partitions: int
    rates: tuple[float, ...]
    seconds: float
    warmup_s: float
    drain_s: float
    poisson: bool
    kill_at_s: float
    restart_after_s: float
    modes: tuple[str, ...]
    capacity_events: int = 0
    shares: bool = False  # steady: `rates` are shares of the capacity line's events/s


async def _session(
    broker: Any, values: Sequence[bytes], run: Run, exactly_once: bool, emit: Emit, out: Path
) -> tuple[Fleet, Topics, Ledger, Producer, Tail, GpuMemory]:
    """Fresh topics, the fleet started and settled, the tail consumer and the producer started."""
    topics = Topics(f"group-{uuid.uuid4().hex[:8]}")
    await asyncio.to_thread(broker.create_topics, topics.names(), partitions=run.partitions)
    fleet = Fleet(run.spec, broker.bootstrap_servers, topics, exactly_once)
    memory = GpuMemory()
    memory.start()
    ledger = Ledger()
    tail = Tail(
        broker.bootstrap_servers,
        topics.decisions,
        topics.dlq,
        run.partitions,
        ledger,
        read_committed=exactly_once,
    )
    producer = Producer(broker.bootstrap_servers, topics.input, values, ledger, seed=7)
    began = time.monotonic()
    ready = []
    try:
        for slot in range(run.processes):
            ready.append(round(await asyncio.to_thread(fleet.start, slot), 2))
            emit(kind="child_ready", slot=slot, pid=fleet.children[slot].proc.pid, ready_s=ready[-1])
        settled = await _settled(fleet, run.partitions, began)
        emit(kind="group_settled", processes=run.processes, seconds=round(settled - began, 2), ready_s=ready)
        await tail.start()
        await producer.start()
    except BaseException:  # a child that failed to start, a timeout, Ctrl-C: nothing started is left running
        await _close(fleet, producer, tail, memory, emit, out)
        raise
    return fleet, topics, ledger, producer, tail, memory


async def _close(
    fleet: Fleet, producer: Producer, tail: Tail, memory: GpuMemory, emit: Emit, out: Path
) -> None:
    """Stop the bench's clients and the fleet, then append every child's stderr tail to
    `out/children.log`; every step runs even when an earlier one failed."""
    for closing in (producer.stop, tail.stop, memory.stop):
        try:
            await asyncio.wait_for(closing(), 20.0)
        except Exception as exc:  # a client that never started, or a broker gone: note it, go on
            emit(kind="note", message=f"closing a client: {exc!r}"[:300])
    await asyncio.to_thread(fleet.stop_all)
    with (out / "children.log").open("a", encoding="utf-8") as log:
        log.write(fleet.log_tail())


async def steady(
    broker: Any, values: Sequence[bytes], run: Run, out: Path, emit: Emit
) -> list[dict[str, Any]]:
    """Step 3 of the module docstring; returns the `load` lines."""
    fleet, _, ledger, producer, tail, memory = await _session(broker, values, run, False, emit, out)
    lines: list[dict[str, Any]] = []
    never = asyncio.Event()
    rates = run.rates
    try:
        if run.warmup_s > 0:
            warm = 20.0 if run.shares else run.rates[0]
            await producer.run(0, warm, run.warmup_s, run.poisson, never)
            emit(kind="warmup", rate=warm, drain_s=await _drain(ledger, {0}, run.drain_s))
        if run.capacity_events > 0:
            load = len(run.rates) + 1
            began = await producer.burst(load, run.capacity_events, never)
            drained = await _drain(ledger, {load}, max(run.drain_s, 600.0))
            line = {
                "kind": "capacity",
                "processes": run.processes,
                **capacity_figures(ledger, load, began),
                "drain_s": drained,
            }
            lines.append(line)
            emit(**line)
            if run.shares:
                rates = tuple(round(share * line["events_s"], 2) for share in run.rates)
        for index, rate in enumerate(rates, start=1):
            before = await _scrape_all(fleet)
            began = await producer.run(index, rate, run.seconds, run.poisson, never)
            fleet.check_alive()
            drained = await _drain(ledger, {index}, run.drain_s)
            service = [service_window(b, a) for b, a in zip(before, await _scrape_all(fleet), strict=True)]
            line = {
                "kind": "load",
                "processes": run.processes,
                "rate": rate,
                **({"share": run.rates[index - 1]} if run.shares else {}),
                **steady_figures(ledger, index, began, run.seconds),
                "drain_s": drained,
                "service": service,
                "gpu_peak_mib": memory.of(fleet.children),
                "gpu_total_peak_mib": memory.gpus(),
            }
            lines.append(line)
            emit(**line)
    finally:
        await _close(fleet, producer, tail, memory, emit, out)
    return lines


async def fault(
    broker: Any, values: Sequence[bytes], run: Run, mode: str, out: Path, emit: Emit
) -> dict[str, Any]:
    """Step 4 of the module docstring for one mode; returns the `fault` line."""
    exactly_once = mode in EOS_MODES
    fleet, _, ledger, producer, tail, memory = await _session(broker, values, run, exactly_once, emit, out)
    victim = run.processes - 1
    never = asyncio.Event()
    try:
        sending = asyncio.create_task(producer.run(1, run.rates[0], run.seconds, run.poisson, never))
        await asyncio.sleep(run.kill_at_s)
        fleet.check_alive()
        held = assignment(fleet.children[victim], 0.0)
        orphaned = held[1] if held is not None else []
        await asyncio.to_thread(fleet.kill, victim)
        clock = FaultClock(kill_perf=time.perf_counter(), kill_mono=time.monotonic())
        emit(kind="killed", mode=mode, slot=victim, partitions=orphaned)
        survivors = [c for s, c in enumerate(fleet.children) if s != victim]
        taken = await _taken(survivors, orphaned, clock.kill_mono)
        emit(kind="taken", mode=mode, seconds=None if taken is None else round(taken - clock.kill_mono, 2))
        await asyncio.sleep(run.restart_after_s)
        restart_ready_s = await asyncio.to_thread(fleet.start, victim)
        emit(kind="restarted", mode=mode, slot=victim, ready_s=round(restart_ready_s, 2))
        await sending
        fleet.check_alive()
        drained = await _drain(ledger, {1}, run.drain_s)
        await asyncio.sleep(1.0)  # duplicates published by the drain's last batches reach the tail
        line = {
            "kind": "fault",
            "mode": mode,
            "processes": run.processes,
            "rate": run.rates[0],
            "seconds": run.seconds,
            "kill_at_s": run.kill_at_s,
            "session_timeout_ms": run.spec.session_timeout_ms,
            **fault_figures(
                ledger,
                clock,
                orphaned,
                survivors=survivors,
                restarted=fleet.children[victim],
                restart_ready_s=restart_ready_s,
            ),
            "drain_s": drained,
            "gpu_peak_mib": memory.of(fleet.children),
            "gpu_total_peak_mib": memory.gpus(),
        }
        emit(**line)
    finally:
        await _close(fleet, producer, tail, memory, emit, out)
    return line


async def _all(
    broker: Any, values: Sequence[bytes], run: Run, scenario: str, out: Path, emit: Emit
) -> list[dict[str, Any]]:
    if scenario == "steady":
        return await steady(broker, values, run, out, emit)
    return [await fault(broker, values, run, mode, out, emit) for mode in run.modes]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `bench.e2e_group`."""
    p.add_argument("--out", default=None, help="output folder (default: $OUT or bench-out/)")
    p.add_argument("--scenario", choices=("steady", "fault"), default="steady")
    p.add_argument("--engine", choices=("stub", "tiny", "release"), default="stub")
    p.add_argument("--release", type=Path, default=None, help="release: the release directory")
    p.add_argument("--gpus", type=int, default=1, help="release: process i runs on GPU i mod this")
    p.add_argument("--fp8", choices=("off", "experts", "text-only"), default="off")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--partitions", type=int, default=12)
    p.add_argument("--rate", default="20", help="events/s, comma-separated (fault: the first)")
    p.add_argument(
        "--shares",
        action="store_true",
        help="steady: --rate gives shares of the capacity line's events/s (needs --capacity-events); the "
        "warm-up runs at 20/s",
    )
    p.add_argument("--seconds", type=float, default=30.0, help="send window per load")
    p.add_argument("--warmup-s", type=float, default=5.0, help="steady: send window before the loads")
    p.add_argument("--drain-s", type=float, default=60.0, help="bound on each drain")
    p.add_argument("--arrivals", choices=("uniform", "poisson"), default="poisson")
    p.add_argument("--kill-at-s", type=float, default=10.0, help="fault: seconds into the window")
    p.add_argument("--restart-after-s", type=float, default=0.0, help="fault: seconds after the kill")
    p.add_argument("--modes", default="alo,eos", help="fault: alo (at-least-once), eos (exactly-once)")
    p.add_argument("--session-timeout-ms", type=int, default=10_000)
    p.add_argument("--pool", type=int, default=128, help="distinct events")
    p.add_argument(
        "--capacity-events",
        type=int,
        default=0,
        help="steady: after the warm-up, a backlog of this many events sent at once; its drain rate is the "
        "group's capacity through Kafka (0: none)",
    )


def _check(args: argparse.Namespace) -> Run:
    """The `Run` of parsed options; `SystemExit` for options that cannot make a run."""
    rates = tuple(float(x) for x in args.rate.split(","))
    modes = tuple(m for m in args.modes.split(",") if m)
    if not rates or any(r <= 0 for r in rates):
        raise SystemExit("bench.e2e_group: --rate needs positive numbers")
    if args.engine == "release" and (args.release is None or not args.release.is_dir()):
        raise SystemExit("bench.e2e_group: --engine release needs --release DIR")
    if args.scenario == "fault" and args.processes < 2:
        raise SystemExit("bench.e2e_group: the fault scenario needs --processes 2 or more")
    if args.scenario == "fault" and (not modes or set(modes) - {"alo", "eos"}):
        raise SystemExit("bench.e2e_group: --modes takes alo and eos")
    if args.shares and (args.scenario != "steady" or args.capacity_events <= 0):
        raise SystemExit("bench.e2e_group: --shares needs --scenario steady and --capacity-events")
    if args.scenario == "fault" and args.kill_at_s >= args.seconds:
        raise SystemExit("bench.e2e_group: --kill-at-s must fall inside --seconds")
    spec = ChildSpec(args.engine, args.release, args.gpus, args.fp8, args.session_timeout_ms)
    return Run(
        spec, args.processes, args.partitions, rates, args.seconds, args.warmup_s, args.drain_s,
        args.arrivals == "poisson", args.kill_at_s, args.restart_after_s, modes, args.capacity_events,
        args.shares,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, run the scenario; returns 0, or 1 when an event was lost (or, exactly-once, decided
    twice)."""
    first = __doc__.splitlines()[0] if __doc__ else None
    p = argparse.ArgumentParser(prog="bench.e2e_group", description=first)
    add_arguments(p)
    args = p.parse_args(argv)
    run = _check(args)

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # the `finally`s below stop the children and the broker
    out = Path(args.out or os.environ.get("OUT") or "bench-out")
    out.mkdir(parents=True, exist_ok=True)
    (out / "children.log").write_text("")
    sink = (out / "group.jsonl").open("w")

    def emit(**fields: Any) -> None:
        line = json.dumps(fields)
        print(line, flush=True)
        sink.write(line + "\n")
        sink.flush()

    from bench.av_placeholder import install_av_placeholder

    install_av_placeholder()  # the engine imports PyAV; the H200 machine has none (no media here)
    from bench.load import make_pool
    from devtools.kafka_local import LocalKafka
    from devtools.tiny_release import write_tiny_release
    from engine.batching.cut import BatchLimits
    from engine.runner import Engine, EngineConfig

    tmp = Path(tempfile.mkdtemp(prefix="clef-group-"))
    broker = LocalKafka()
    try:
        broker.start()
        tiny = write_tiny_release(tmp / "tiny")
        if run.spec.engine == "tiny":
            run = replace(run, spec=replace(run.spec, model_path=tiny))
        config = EngineConfig(device="cpu", dtype="float32", limits=BatchLimits(65_536, 256))
        sizing = Engine.from_release(tiny, config=config)
        values = [r.model_dump_json().encode() for r in make_pool(sizing, random.Random(0), args.pool)]
        info = {
            "kind": "info",
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "scenario": args.scenario,
            "engine": run.spec.engine,
            "release": str(args.release),
            "fp8": run.spec.fp8,
            "processes": run.processes,
            "gpus": run.spec.gpus,
            "partitions": run.partitions,
            "rates": list(run.rates),
            "seconds": run.seconds,
            "arrivals": args.arrivals,
            "session_timeout_ms": run.spec.session_timeout_ms,
            "broker_version": broker.broker_version,
        }
        emit(**info)
        lines = asyncio.run(_all(broker, values, run, args.scenario, out, emit))
        text = summary_text(info, lines)
        (out / "group.txt").write_text(text, encoding="utf-8")
        print(text, flush=True)
        bad = any(
            line.get("lost", 0) or (line.get("mode") in EOS_MODES and line.get("duplicates", 0))
            for line in lines
        )
        emit(kind="done", lines=len(lines), failed=bad)
        return 1 if bad else 0
    finally:
        for child in _SPAWNED:
            if child.proc.poll() is None:
                kill(child)
        broker.stop()
        sink.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
