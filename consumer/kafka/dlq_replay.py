"""`clef-router dlq replay`: send dead-lettered records back to their original topic.

Reads the DLQ topic with a consumer group of its own up to the end offsets seen at start, keeps the records
whose reason code is wanted, and re-sends each with its original value, key and headers (the DLQ headers
of `schemas.dead_letter` removed), acknowledged before its DLQ offset is committed.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Literal

from consumer.kafka.settings import KafkaSettings
from consumer.records import OutRecord
from schemas.dead_letter import DlqHeaderError, parse_dlq_headers, strip_dlq_headers
from schemas.errors import DlqReason

if TYPE_CHECKING:  # aiokafka and the producer are imported when a replay runs, not with the CLI
    from aiokafka import ConsumerRecord

    from consumer.kafka.producer import Producer


def reason_filter(reasons: Collection[str]) -> frozenset[DlqReason]:
    """Validate reason codes given on the command line; raises `ValueError` for an unknown one."""
    return frozenset(DlqReason(r) for r in reasons)


async def replay(
    kafka: KafkaSettings,
    dlq_topic: str,
    *,
    group_id: str,
    reasons: frozenset[DlqReason] = frozenset(),
    limit: int | None = None,
    dry_run: bool = False,
) -> dict[str, int]:
    """Send DLQ records back to their original topic (original value, key and headers, DLQ headers removed).

    Reads `dlq_topic` with its own consumer group (so a second replay does not resend) up to the end offsets
    seen at start; records whose reason is not in `reasons` (when given) are skipped; each replayed record
    is acknowledged (`acks=all`) before its DLQ offset is committed. Returns counts.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from consumer.kafka.access import topic_partitions
    from consumer.kafka.config import client_options
    from consumer.kafka.producer import Producer

    consumer = AIOKafkaConsumer(
        **client_options(kafka), group_id=group_id, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    producer = Producer(kafka)
    counts = {"replayed": 0, "skipped": 0, "unreadable": 0}
    try:  # both are closed below even when a start fails or is cancelled (no "Unclosed ..." warnings)
        await consumer.start()
        await producer.start()
        parts = [TopicPartition(dlq_topic, p) for p in await topic_partitions(kafka, dlq_topic)]
        if not parts:
            return counts
        consumer.assign(parts)
        ends: dict[Any, int] = await consumer.end_offsets(parts)
        todo = {tp for tp in parts if ends[tp] > await consumer.position(tp)}
        while todo and (limit is None or counts["replayed"] < limit):
            batch = await consumer.getmany(*todo, timeout_ms=500, max_records=200)
            for tp, records in batch.items():
                last: int | None = None
                for rec in records:
                    if rec.offset >= ends[tp] or (limit is not None and counts["replayed"] >= limit):
                        todo.discard(tp)
                        break
                    last = rec.offset
                    outcome = await _replay_record(rec, producer, kafka, reasons, dry_run)
                    counts[outcome] += 1
                    if outcome == "replayed" and rec.offset + 1 >= ends[tp]:
                        todo.discard(tp)
                if not dry_run and last is not None:
                    await consumer.commit({tp: last + 1})
            for tp in list(todo):
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
    finally:
        await producer.stop()
        await consumer.stop()
    return counts


async def _replay_record(
    rec: ConsumerRecord,
    producer: Producer,
    kafka: KafkaSettings,
    reasons: frozenset[DlqReason],
    dry_run: bool,
) -> Literal["replayed", "skipped", "unreadable"]:
    """Send one DLQ record back to its original topic (unless `dry_run`), acknowledged; says what became of
    it. Raises what `Producer.send_retrying` raises once its attempts are spent."""
    headers = [(k, bytes(v) if v is not None else None) for k, v in rec.headers]
    try:
        info = parse_dlq_headers(headers)
    except DlqHeaderError:
        return "unreadable"
    if reasons and info.reason not in reasons:
        return "skipped"
    if not dry_run:
        out = OutRecord(info.original_topic, rec.key, rec.value, tuple(strip_dlq_headers(headers)))
        await producer.send_retrying(out, kafka.send_attempts)
    return "replayed"
