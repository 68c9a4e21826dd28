"""The in-flight record types of the pipeline, each field with the one stage that writes it.

A Kafka record travels as an `InputRecord` inside a `Unit` (a run of consecutive records of one input
partition) from the fetch loop through the batcher to its partition's emitter, which turns its outcomes
into `OutRecord`s for the publisher (or, exactly-once, the committer's transactions). `PartitionState` is
the emitter's queue of one input partition.

Writers (a field is written by exactly one stage; everything else only reads it):
- pipeline (fetch loop, event loop): builds `InputRecord`s and `Unit`s; `Unit.future` at construction.
- prepare stage (batcher thread pool): the elements of `Unit.event_ids`, before `Unit.future` resolves.
- emitter (event loop): `Unit.left`, `Unit.dead`, and every field of `PartitionState` after construction.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from aiokafka import TopicPartition

from schemas.systemone import SystemOneResponse

Headers = tuple[tuple[str, bytes | None], ...]
"""Kafka record headers as (name, value) pairs, in record order."""

Outcome = SystemOneResponse | BaseException
"""What the batcher gives back per record: the engine's response, or the permanent error for it."""


class InputRecord(NamedTuple):
    """What the pipeline keeps of a consumed record. Written by the fetch loop, immutable after."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int | None = None


class OutRecord(NamedTuple):
    """One record to publish (an answer, a route record or a dead letter). Built by the emitter (router,
    dlq), immutable after; sent by the publisher or the committer's transactions."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(slots=True, eq=False)
class PartitionState:
    """The emitter's ordered queue of one input partition. Built by `Emitter.open`; every field is
    written by the emitter only (`push`, `close`, its task), on the event loop."""

    tp: TopicPartition  # the input partition
    items: deque[Unit | None] = field(default_factory=deque)  # offset order; None = stop (emitter)
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # set on push/close (emitter)
    task: asyncio.Task[None] | None = None  # the partition's emitter task (emitter, once at open)
    revoked: bool = False  # closed or fenced: publish nothing more, mark nothing done (emitter)


@dataclass(slots=True, eq=False)
class Unit:
    """Consecutive fetched records of one input partition on their way through the pipeline.

    The offset span it covers is `[records[0].offset, records[-1].offset + 1)`; the pipeline tracks it in
    the committer before the unit is pushed.
    """

    state: PartitionState  # its partition's emitter queue (pipeline, at construction)
    records: list[InputRecord]  # (pipeline, at construction; never changed)
    # `event_ids[i]`: the `ce_id` header of record i, else the id in its value; None while unknown. The
    # list is made by the pipeline (all None); its elements are written by the prepare stage only, and read
    # by the emitter once `future` resolved (which orders the writes before the reads).
    event_ids: list[str | None]
    future: asyncio.Future[list[Outcome]]  # one outcome per record, in order (pipeline, at construction)
    left: int = 0  # outputs not yet acknowledged (emitter)
    dead: int = 0  # records dead-lettered (emitter)

    @property
    def next_offset(self) -> int:
        """The offset after the unit's last record (what a commit covering the unit commits)."""
        return self.records[-1].offset + 1
