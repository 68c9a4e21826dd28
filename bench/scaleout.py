"""`python3 -m bench.scaleout`: several `clef-router run --stub-engine` processes in one consumer group.

Scale-out the way Kafka users do it: one service process per GPU, all in one group on one input topic
(12 partitions), so partitions spread over the processes. This runs the stub engine on CPU (no GPU) against
a real local broker (or `--bootstrap`): a producer sends sample events at a fixed rate while processes join
and leave on a schedule (`--plan`, default 1 -> 2 -> 4 -> 2 -> 1, one step per `--step` seconds; leaving is
SIGTERM: drain, commit, leave the group). Every second it prints a JSON line: processes running, events
produced and committed, committed events/s over the last second, and the group's lag (produced minus
committed). At the end it checks that nothing was lost: every input offset committed and every event id
present on the decisions topic (at-least-once: a rebalance may answer some events twice; counted).
Processes inherit this interpreter (`sys.executable -m consumer.cli`), so from a worktree they run its code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from bench.group_offsets import committed as committed_offsets
from devtools.stub import sample_event

PARTITIONS = 12


def _env(bootstrap: str, prefix: str, topic: str, group: str) -> dict[str, str]:
    """The environment of one service process (settings through `CLEF_*` variables, HTTP off)."""
    env = dict(os.environ)
    env.update(
        {
            "CLEF_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
            "CLEF_KAFKA__GROUP_ID": group,
            "CLEF_KAFKA__COMMIT_INTERVAL_MS": "200",
            "CLEF_KAFKA__SESSION_TIMEOUT_MS": "10000",
            "CLEF_KAFKA__REVOKE_TIMEOUT_S": "5",
            "CLEF_TOPICS__INPUT": json.dumps([topic]),
            "CLEF_TOPICS__DECISIONS": f"{prefix}.decisions",
            "CLEF_TOPICS__ROUTE_PREFIX": f"{prefix}.route.",
            "CLEF_TOPICS__REVIEW": f"{prefix}.route.review",
            "CLEF_TOPICS__UNROUTED": f"{prefix}.route.unrouted",
            "CLEF_TOPICS__DLQ": f"{prefix}.dlq",
            "CLEF_HTTP__ENABLED": "false",
            "CLEF_LOG_LEVEL": "warning",
        }
    )
    return env


class Fleet:
    """The service processes of the run, started and stopped (SIGTERM, then wait) by this process only."""

    def __init__(self, env: dict[str, str]) -> None:
        self._env = env
        self.procs: list[subprocess.Popen[bytes]] = []

    def scale_to(self, n: int) -> None:
        """Start or stop (newest first) processes until `n` run. Stopping blocks until each has exited."""
        while len(self.procs) < n:
            cmd = [sys.executable, "-m", "consumer.cli", "run", "--stub-engine"]
            self.procs.append(subprocess.Popen(cmd, env=self._env, stdout=subprocess.DEVNULL))
        while len(self.procs) > n:
            proc = self.procs.pop()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def check_alive(self) -> None:
        """Raise if a process exited on its own."""
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"service process {proc.pid} exited with {proc.returncode}")


async def _produce(bootstrap: str, topic: str, rate: float, stop: asyncio.Event, sent: list[int]) -> None:
    """Send sample events at `rate` per second (in 50 ms slices) until `stop`; `sent[0]` counts them."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        t0 = time.monotonic()
        while not stop.is_set():
            due = int(rate * (time.monotonic() - t0))
            batch = [
                await producer.send(topic, sample_event(i), key=f"k{i}".encode()) for i in range(sent[0], due)
            ]
            if batch:
                await asyncio.gather(*batch)
                sent[0] = due
            await asyncio.sleep(0.05)
    finally:
        await producer.stop()


async def _decision_ids(admin: Any, bootstrap: str, topic: str) -> list[str]:
    """Every event id on the decisions topic, read from the beginning to the current end."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    described = await admin.describe_topics([topic])
    numbers = sorted(p["partition"] for t in described if t["error_code"] == 0 for p in t["partitions"])
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    ids: list[str] = []
    try:
        parts = [TopicPartition(topic, p) for p in numbers]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        todo = {tp for tp in parts if ends[tp] > 0}
        deadline = time.monotonic() + 120
        while todo and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                ids += [json.loads(r.value)["event_id"] for r in records]
            todo = {tp for tp in todo if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()
    return ids


async def run(
    bootstrap: str, plan: Sequence[int], step_s: float, rate: float, drain_s: float
) -> dict[str, Any]:
    """The whole scenario on `bootstrap`; prints a JSON line per second and returns the final figures."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    prefix = f"scaleout-{uuid.uuid4().hex[:8]}"
    topic, group = f"{prefix}.in", f"{prefix}.g"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    fleet = Fleet(_env(bootstrap, prefix, topic, group))
    stop, sent = asyncio.Event(), [0]
    producer = asyncio.create_task(_produce(bootstrap, topic, rate, stop, sent))
    t0 = time.monotonic()
    last = 0
    samples: list[dict[str, Any]] = []
    try:
        for index, n in enumerate(plan):
            await asyncio.to_thread(fleet.scale_to, n)
            step_end = t0 + (index + 1) * step_s
            final = index == len(plan) - 1
            while True:
                if final and not stop.is_set() and time.monotonic() >= step_end:
                    stop.set()  # the last step produces for its time too, then drains
                    await producer
                    step_end += drain_s
                if time.monotonic() >= step_end:
                    break
                await asyncio.sleep(1.0)
                fleet.check_alive()
                committed = await committed_offsets(admin, group, topic, last)
                sample = {
                    "kind": "sample",
                    "t": round(time.monotonic() - t0, 1),
                    "processes": len(fleet.procs),
                    "produced": sent[0],
                    "committed": committed,
                    "events_s": committed - last,
                    "lag": sent[0] - committed,
                }
                last = committed
                samples.append(sample)
                print(json.dumps(sample), flush=True)
                if final and stop.is_set() and committed >= sent[0]:
                    break
        await asyncio.to_thread(fleet.scale_to, 0)
        committed = await committed_offsets(admin, group, topic, last)
        ids = await _decision_ids(admin, bootstrap, f"{prefix}.decisions")
    finally:
        stop.set()
        await asyncio.to_thread(fleet.scale_to, 0)
        if not producer.done():
            producer.cancel()
        await admin.close()
    expected = {f"ev-{i}" for i in range(sent[0])}
    return {
        "kind": "result",
        "produced": sent[0],
        "committed": committed,
        "decisions": len(ids),
        "missing": len(expected - set(ids)),
        "duplicates": len(ids) - len(set(ids)),
        "lost": committed < sent[0] or bool(expected - set(ids)),
        "peak_events_s_by_processes": _peaks(samples),
    }


def _peaks(samples: Sequence[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in samples:
        key = str(s["processes"])
        out[key] = max(out.get(key, 0), int(s["events_s"]))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the scenario (starting a local broker unless `--bootstrap`); exit 1 if anything was lost."""
    p = argparse.ArgumentParser(
        prog="bench.scaleout", description=__doc__.splitlines()[0] if __doc__ else None
    )
    p.add_argument("--bootstrap", default=None, help="use this broker instead of starting a local one")
    p.add_argument("--plan", default="1,2,4,2,1", help="processes in each step")
    p.add_argument("--step", type=float, default=15.0, help="seconds per step")
    p.add_argument("--rate", type=float, default=500.0, help="events produced per second")
    p.add_argument("--drain", type=float, default=60.0, help="most seconds to wait for the last events")
    args = p.parse_args(argv)
    plan = [int(x) for x in args.plan.split(",")]
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from devtools.kafka_local import LocalKafka

        broker = LocalKafka()
        broker.start()
        bootstrap = broker.bootstrap_servers
    try:
        result = asyncio.run(run(bootstrap, plan, args.step, args.rate, args.drain))
    finally:
        if broker is not None:
            broker.stop()
    print(json.dumps(result), flush=True)
    return 1 if result["lost"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
