"""Proof that the Kafka harness is a real broker: produce, consume, commit, resume, restart, CLI."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import ConsumerRecord, TopicPartition

from devtools.kafka_local import LocalKafka

pytestmark = pytest.mark.kafka

RECORDS = 1_000
COMMIT_AFTER = 600
PARTITIONS = 3


def _producer(bootstrap: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, request_timeout_ms=15_000
    )


def _consumer(bootstrap: str, topic: str, group: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=10_000,
        heartbeat_interval_ms=1_000,
    )


async def _produce(bootstrap: str, topic: str, start: int, count: int) -> None:
    producer = _producer(bootstrap)
    await producer.start()
    try:
        sends = [
            await producer.send(topic, key=f"k{i % 37}".encode(), value=str(i).encode())
            for i in range(start, start + count)
        ]
        await asyncio.wait_for(asyncio.gather(*sends), 30)
    finally:
        await producer.stop()


async def _read(
    consumer: AIOKafkaConsumer, limit: int, timeout_s: float
) -> list[ConsumerRecord[bytes, bytes]]:
    """Read exactly ``limit`` records in delivery order (fails if they do not arrive within ``timeout_s``)."""
    out: list[ConsumerRecord[bytes, bytes]] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < limit:
        assert time.monotonic() < deadline, f"only {len(out)} of {limit} records within {timeout_s} s"
        batches = await consumer.getmany(timeout_ms=500, max_records=limit - len(out))
        for records in batches.values():
            out.extend(records)
    return out


async def test_consumer_resumes_at_committed_offset(
    kafka_broker: LocalKafka, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("harness", partitions=PARTITIONS)
    group = f"g-{topic}"
    bootstrap = kafka_broker.bootstrap_servers
    await _produce(bootstrap, topic, 0, RECORDS)

    first = _consumer(bootstrap, topic, group)
    await first.start()
    try:
        seen_first = await _read(first, COMMIT_AFTER, 60)
        committed: dict[TopicPartition, int] = {}
        for rec in seen_first:  # commit exactly what was processed, nothing fetched beyond it
            committed[TopicPartition(rec.topic, rec.partition)] = rec.offset + 1
        await first.commit(committed)
    finally:
        await first.stop()

    second = _consumer(bootstrap, topic, group)
    await second.start()
    try:
        for tp, offset in committed.items():
            assert await second.committed(tp) == offset
        seen_second = await _read(second, RECORDS - COMMIT_AFTER, 60)
        extra = await second.getmany(timeout_ms=1_000)
        assert not any(extra.values()), "more records than were produced"
    finally:
        await second.stop()

    # the second consumer starts exactly at the committed offset of every partition it read
    first_offset: dict[int, int] = {}
    for rec in seen_second:
        first_offset.setdefault(rec.partition, rec.offset)
    for partition, offset in first_offset.items():
        assert offset == committed.get(TopicPartition(topic, partition), 0)

    # together: every record exactly once, and per key in production order
    values = [int(r.value) for r in seen_first + seen_second if r.value is not None]
    assert sorted(values) == list(range(RECORDS))
    positions = [(r.partition, r.offset) for r in seen_first + seen_second]
    assert len(set(positions)) == RECORDS
    per_key: dict[bytes, list[int]] = defaultdict(list)
    for rec in seen_first + seen_second:
        assert rec.key is not None
        assert rec.value is not None
        per_key[rec.key].append(int(rec.value))
    assert all(seq == sorted(seq) for seq in per_key.values())
    assert len({r.partition for r in seen_first + seen_second}) == PARTITIONS


async def test_restartable_broker_keeps_data(restartable_broker: LocalKafka) -> None:
    broker = restartable_broker
    bootstrap = broker.bootstrap_servers
    topic = "restart.test"
    await asyncio.to_thread(broker.create_topics, [topic], partitions=2)
    await _produce(bootstrap, topic, 0, 10)
    run_dir = broker.run_dir

    await asyncio.to_thread(broker.restart)
    assert broker.bootstrap_servers == bootstrap
    assert broker.run_dir == run_dir
    await _produce(bootstrap, topic, 10, 10)

    await asyncio.to_thread(broker.restart, hard=True)  # SIGKILL, then start on the same data
    assert broker.is_running()
    await _produce(bootstrap, topic, 20, 10)

    consumer = _consumer(bootstrap, topic, "restart-group")
    await consumer.start()
    try:
        records = await _read(consumer, 30, 60)
    finally:
        await consumer.stop()
    assert sorted(int(r.value) for r in records if r.value is not None) == list(range(30))


def _read_lines(proc: subprocess.Popen[bytes], count: int, timeout_s: float) -> list[str]:
    """Read ``count`` lines of the child's stdout (unbuffered pipe), bounded by ``timeout_s``."""
    import select

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout_s
    while buf.count(b"\n") < count:
        left = deadline - time.monotonic()
        assert left > 0, f"no {count} lines within {timeout_s} s; got {buf!r}"
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(fd, 4096)
            assert chunk, f"stdout closed early (exit {proc.poll()}); got {buf!r}"
            buf += chunk
    return buf.decode().splitlines()[:count]


async def _topic_partitions(bootstrap: str, names: list[str]) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        described = await admin.describe_topics(names)
        return {t["topic"]: len(t["partitions"]) for t in described if t["error_code"] == 0}
    finally:
        await admin.close()


@pytest.mark.parametrize(
    ("sig", "keep_dir"),
    [(signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["sigterm-temp-dir", "sigint-kept-dir"],
)
def test_kafka_local_command(kafka_broker: LocalKafka, tmp_path: Path, sig: int, keep_dir: bool) -> None:
    # kafka_broker: the jars are already in the cache, so start-up here is seconds
    env = dict(os.environ, TMPDIR=str(tmp_path))
    cmd = [sys.executable, "-m", "consumer.cli", "kafka-local", "--port", "0", "--topics", "a.in,b.out"]
    cmd += ["--partitions", "2"]
    data_dir = tmp_path / "kept"
    if keep_dir:
        cmd += ["--data-dir", str(data_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, bufsize=0)
    try:
        lines = _read_lines(proc, 4, 120)
        match = re.fullmatch(r"bootstrap=127\.0\.0\.1:(\d+)", lines[0])
        assert match, lines
        bootstrap = lines[0].removeprefix("bootstrap=")
        assert lines[1].startswith("kafka_version=4.")
        run_dir = Path(lines[3].removeprefix("data_dir="))
        assert run_dir.is_dir()
        assert asyncio.run(_topic_partitions(bootstrap, ["a.in", "b.out"])) == {"a.in": 2, "b.out": 2}

        proc.send_signal(sig)
        code = proc.wait(60)
        assert code == 0, proc.stderr.read() if proc.stderr else b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    if keep_dir:
        assert run_dir == data_dir.resolve()
        assert (data_dir / "data" / "meta.properties").is_file()
    else:
        assert not run_dir.exists()
        assert list(tmp_path.iterdir()) == []
