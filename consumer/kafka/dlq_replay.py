"""`clef-router dlq replay`: send dead-lettered records back to their original topic.

Reads the DLQ topic with a consumer group of its own up to the end offsets seen at start, keeps the records
whose reason code is wanted, and re-sends each with its original value, key and headers (the DLQ headers
of `schemas.dead_letter` removed), acknowledged before its DLQ offset is committed.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from consumer.records import OutRecord
from consumer.settings import KafkaSettings
from schemas.dead_letter import DlqHeaderError, parse_dlq_headers, strip_dlq_headers
from schemas.errors import DlqReason


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
                    headers = [(k, bytes(v) if v is not None else None) for k, v in rec.headers]
                    try:
                        info = parse_dlq_headers(headers)
                    except DlqHeaderError:
                        counts["unreadable"] += 1
                        continue
                    if reasons and info.reason not in reasons:
                        counts["skipped"] += 1
                        continue
                    if not dry_run:
                        out = OutRecord(
                            info.original_topic, rec.key, rec.value, tuple(strip_dlq_headers(headers))
                        )
                        await producer.send_retrying(out, kafka.send_attempts)
                    counts["replayed"] += 1
                    if rec.offset + 1 >= ends[tp]:
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
