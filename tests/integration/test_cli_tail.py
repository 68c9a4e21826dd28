"""`clef-router tail` and `dlq replay --dry-run` against the real broker, through `consumer.cli.main`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumer import cli
from devtools.kafka_local import LocalKafka
from schemas.dead_letter import DeadLetterInfo, with_dlq_headers
from schemas.errors import DlqReason, RequestError

NewTopic = Callable[..., str]


def _decision(event_id: str, department: str, confidence: float) -> bytes:
    route = {
        "department": department,
        "department_confidence": confidence,
        "urgency": 2.0,
        "urgency_label": "high",
        "outage": False,
        "outage_probability": 0.2,
    }
    return json.dumps({"event_id": event_id, "route": route}).encode()


def _send(
    bootstrap: str, topic: str, records: list[tuple[bytes, bytes, list[tuple[str, bytes | None]]]]
) -> None:
    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for key, value, headers in records:
                await producer.send_and_wait(topic, value, key=key, headers=headers)
        finally:
            await producer.stop()

    asyncio.run(send())


def _dead_letter(original_topic: str, offset: int) -> list[tuple[str, bytes | None]]:
    info = DeadLetterInfo.from_exception(
        RequestError(DlqReason.bad_json, "Invalid JSON: expected value"),
        topic=original_topic,
        partition=0,
        offset=offset,
        stage="decode",
    )
    return with_dlq_headers([], info)


def test_tail_prints_the_newest_decisions_with_route_topic_and_why(
    kafka_broker: LocalKafka,
    new_topic: NewTopic,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = new_topic("decisions", partitions=2)
    monkeypatch.setenv("CLEF_TOPICS__DECISIONS", topic)  # so the route topic is worked out, not read
    records = [(f"k{i}".encode(), _decision(f"e{i}", "storage", 0.9), []) for i in range(5)]
    records.append((b"low", _decision("e-low", "storage", 0.06), []))
    _send(kafka_broker.bootstrap_servers, topic, records)

    assert cli.main(["tail", "--bootstrap", kafka_broker.bootstrap_servers, "--count", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert {line.split()[1] for line in lines} == {"e4", "e-low"}, lines  # the newest two of six
    low = next(line for line in lines if "e-low" in line)
    assert "-> route.review" in low
    assert "confidence 0.06 < review threshold 0.5" in low
    high = next(line for line in lines if "e-low" not in line)
    assert "-> route.storage" in high

    assert (
        cli.main(["tail", "--bootstrap", kafka_broker.bootstrap_servers, "--from-beginning", "--max", "3"])
        == 0
    )
    oldest = capsys.readouterr().out.splitlines()
    assert len(oldest) == 3, oldest
    assert "e-low" not in "".join(oldest)  # from the oldest record on, per partition in offset order


def test_tail_on_the_dlq_shows_reason_stage_and_origin(
    kafka_broker: LocalKafka, new_topic: NewTopic, capsys: pytest.CaptureFixture[str]
) -> None:
    dlq = new_topic("dlq")
    _send(kafka_broker.bootstrap_servers, dlq, [(b"bad", b"{nope", _dead_letter("alerts.in", 41))])
    assert cli.main(["tail", "--bootstrap", kafka_broker.bootstrap_servers, "--topic", dlq]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert "reason=bad_json" in line
    assert "stage=decode" in line
    assert "from=alerts.in[0]@41" in line
    assert "department=None" not in line


def test_tail_follow_stops_after_max_records(
    kafka_broker: LocalKafka, new_topic: NewTopic, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = new_topic("decisions")
    _send(kafka_broker.bootstrap_servers, topic, [(b"a", _decision("e0", "network", 0.8), [])])
    argv = ["tail", "--bootstrap", kafka_broker.bootstrap_servers, "--topic", topic]
    assert cli.main([*argv, "--follow", "--max", "1", "--timeout", "60"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    # fewer records than --max within --timeout: a one-line error, exit 1
    assert cli.main([*argv, "--from-beginning", "--follow", "--max", "2", "--timeout", "3"]) == 1
    captured = capsys.readouterr()
    assert "gave up after 3 s with 1 of 2 records" in captured.err
    assert captured.err.count("\n") == 1


def test_dlq_replay_dry_run_sends_nothing_and_says_so(
    kafka_broker: LocalKafka,
    new_topic: NewTopic,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dlq, original = new_topic("dlq"), new_topic("in")
    monkeypatch.setenv("CLEF_TOPICS__DLQ", dlq)
    _send(
        kafka_broker.bootstrap_servers, dlq, [(b"k", b"{nope", _dead_letter(original, i)) for i in range(3)]
    )
    argv = ["dlq", "replay", "--bootstrap", kafka_broker.bootstrap_servers, "--group", f"g-{dlq}"]
    assert cli.main([*argv, "--dry-run"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dry_run"] is True
    assert report["would_replay"] == 3
    assert "replayed" not in report

    async def count_original() -> int:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka_broker.bootstrap_servers, enable_auto_commit=False
        )
        await consumer.start()
        try:
            tp = TopicPartition(original, 0)
            return int((await consumer.end_offsets([tp]))[tp])
        finally:
            await consumer.stop()

    assert asyncio.run(count_original()) == 0
