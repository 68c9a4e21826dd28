"""Soak benchmark (not a test): `clef-router run --stub-engine` as a subprocess for `--minutes` at a steady
`--rate` of events/s, its RSS and open file descriptors sampled from /proc, then growth reported.

    python -m bench.soak --minutes 20 --rate 500            # starts a local broker
    python -m bench.soak --minutes 2 --bootstrap 127.0.0.1:9092

The first sample is taken after `--warmup-s` (imports, first batches, allocator pools settling); growth is
last sample minus that one. At the end the service gets SIGTERM, and the committed offsets are compared
with what was produced (the service must have kept up). Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.group_offsets import committed as committed_offsets
from devtools.stub import sample_event


@dataclass(frozen=True)
class Sample:
    """One reading of the service process at `t_s` seconds after the start of the run."""

    t_s: float
    rss_mib: float
    fds: int
    produced: int
    committed: int


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _soak(bootstrap: str, minutes: float, rate: int, warmup_s: float, every_s: float) -> list[Sample]:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient

    prefix = f"soak-{uuid.uuid4().hex[:6]}"
    topic, group = f"{prefix}.in", f"{prefix}.g"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEF_")}
    env |= {
        "CLEF_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "CLEF_KAFKA__GROUP_ID": group,
        "CLEF_TOPICS__INPUT": f'["{topic}"]',
        "CLEF_TOPICS__DECISIONS": f"{prefix}.decisions",
        "CLEF_TOPICS__ROUTE_PREFIX": f"{prefix}.route.",
        "CLEF_TOPICS__REVIEW": f"{prefix}.route.review",
        "CLEF_TOPICS__UNROUTED": f"{prefix}.route.unrouted",
        "CLEF_TOPICS__DLQ": f"{prefix}.dlq",
        "CLEF_HTTP__ENABLED": "false",
        "CLEF_LOG_LEVEL": "warning",
    }
    from consumer.kafka.access import ensure_topics
    from consumer.settings import KafkaSettings

    await ensure_topics(KafkaSettings(bootstrap_servers=bootstrap, topic_partitions=3), [topic])
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    await producer.start()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    produced = 0
    service = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "consumer.cli", "run", "--stub-engine",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    samples: list[Sample] = []
    began = time.monotonic()
    end = began + minutes * 60
    next_sample = began + warmup_s
    try:
        while (now := time.monotonic()) < end:
            if service.returncode is not None:
                raise RuntimeError(f"the service exited with code {service.returncode}")
            due = int((now - began) * rate) + 1  # a steady rate: catch up to where the clock says
            futs = [
                await producer.send(topic, sample_event(i), key=f"k{i % 50}".encode())
                for i in range(produced, due)
            ]
            produced = max(produced, due)
            if futs:
                await asyncio.gather(*futs)
            if now >= next_sample:
                committed = await committed_offsets(admin, group, topic)
                sample = Sample(now - began, _rss_mib(service.pid), _fds(service.pid), produced, committed)
                samples.append(sample)
                print(
                    f"t={sample.t_s:7.1f} s  rss={sample.rss_mib:7.1f} MiB  fds={sample.fds:4d}  "
                    f"produced={sample.produced}  committed={sample.committed}",
                    flush=True,
                )
                next_sample += every_s
            await asyncio.sleep(0.05)
        for _ in range(120):  # at most a minute for the service to catch up
            final = await committed_offsets(admin, group, topic)
            if final >= produced:
                break
            await asyncio.sleep(0.5)
        samples.append(
            Sample(time.monotonic() - began, _rss_mib(service.pid), _fds(service.pid), produced, final)
        )
    finally:
        await producer.stop()
        await admin.close()
        with contextlib.suppress(ProcessLookupError):
            service.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(service.wait(), 60)
        except TimeoutError:
            service.kill()
            await asyncio.wait_for(service.wait(), 10)
    return samples


def report(samples: list[Sample], minutes: float, rate: int) -> str:
    """The summary lines: growth from the first to the last sample."""
    if len(samples) < 2:
        return "soak: too few samples (run longer than the warm-up)"
    first, last = samples[0], samples[-1]
    hours = (last.t_s - first.t_s) / 3600
    growth = last.rss_mib - first.rss_mib
    return (
        f"soak: {minutes:g} min at {rate}/s, {last.produced} events produced, {last.committed} committed\n"
        f"soak: RSS {first.rss_mib:.1f} -> {last.rss_mib:.1f} MiB ({growth:+.1f} MiB over "
        f"{last.t_s - first.t_s:.0f} s, {growth / hours if hours else float('nan'):+.1f} MiB/h); "
        f"open fds {first.fds} -> {last.fds} ({last.fds - first.fds:+d})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=500, help="events per second")
    parser.add_argument("--bootstrap", default=None, help="use this broker (default: start a local one)")
    parser.add_argument("--warmup-s", type=float, default=30.0)
    parser.add_argument("--every-s", type=float, default=30.0, help="seconds between samples")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.rate < 1:
        parser.error("--minutes must be > 0 and --rate >= 1")
    from devtools.kafka_local import LocalKafka

    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        broker = LocalKafka()
        broker.start()
        bootstrap = broker.bootstrap_servers
    try:
        samples = asyncio.run(_soak(bootstrap, args.minutes, args.rate, args.warmup_s, args.every_s))
    finally:
        if broker is not None:
            broker.stop()
    print(report(samples, args.minutes, args.rate), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
