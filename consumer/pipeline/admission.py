"""What the fetch loop may take: each input topic's priority class, the urgent reserve of the in-flight
bound, and the wait for room when the emitter is full.

Classes: an input topic's class is `batching.priority.topics[topic]`, else `batching.priority.default`
(0 the most urgent); the batcher runs records of a lower class first. A topic is urgent when its class is
below the default one.

Reserve: with urgent topics configured, the last `reserve = min(kafka.fetch_max_records,
kafka.max_in_flight // 8)` records of the in-flight bound are kept for them (none when `max_in_flight` is
below 8). Every assigned partition is fetched while more than `reserve` records of room are left, at most
down to the reserve; within it (`0 < room <= reserve`) only the assigned partitions of urgent topics are
fetched, so a critical alert arriving behind a backlog is taken at once instead of after the backlog's
fetched records. With no urgent partition assigned there is no reserve: everything is fetched until the
emitter is full. Full (`room <= 0`): `wait_for_room`. A partition's records all have one class, so
offsets are still committed in order per partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from aiokafka import TopicPartition

from consumer.kafka.source import Source
from consumer.pipeline.emitter import Emitter
from consumer.settings import Settings

PAUSE_AFTER_S = 0.5  # the emitter full this long -> pause every input partition


@dataclass(frozen=True, slots=True)
class FetchScope:
    """One fetch: at most `max_records` (>= 1), from `partitions` (None: every assigned partition)."""

    max_records: int
    partitions: tuple[TopicPartition, ...] | None


@dataclass(frozen=True, slots=True)
class TopicClasses:
    """The priority class of every input topic, the urgent ones among them, and their reserve of the
    in-flight bound. Built once from the settings (`from_settings`); immutable."""

    classes: Mapping[str, int]  # input topic -> class
    default: int  # the class of a topic not in `classes`
    urgent: frozenset[str]  # topics whose class is below `default`
    reserve: int  # records of the in-flight bound only urgent topics are fetched into
    fetch_max_records: int

    @classmethod
    def from_settings(cls, settings: Settings) -> TopicClasses:
        priority = settings.batching.priority
        kafka = settings.kafka
        classes = {topic: priority.topics.get(topic, priority.default) for topic in settings.topics.input}
        urgent = frozenset(topic for topic, level in classes.items() if level < priority.default)
        reserve = min(kafka.fetch_max_records, kafka.max_in_flight // 8) if urgent else 0
        return cls(classes, priority.default, urgent, reserve, kafka.fetch_max_records)

    def of(self, topic: str) -> int:
        """The class of `topic`'s records."""
        return self.classes.get(topic, self.default)

    def scope(self, room: int, assignment: Callable[[], Collection[TopicPartition]]) -> FetchScope | None:
        """What to fetch with `room` records free in the emitter (see the module docstring); None when
        nothing may be fetched (full). `assignment` is asked only when urgent topics are configured."""
        urgent: tuple[TopicPartition, ...] = ()
        if self.reserve > 0:
            urgent = tuple(sorted(tp for tp in assignment() if tp.topic in self.urgent))
        reserve = self.reserve if urgent else 0
        if room > reserve:
            return FetchScope(min(self.fetch_max_records, room - reserve), None)
        if room > 0:
            return FetchScope(min(self.fetch_max_records, room), urgent)
        return None


async def wait_for_room(emitter: Emitter, source: Source, resume_level: int, stop: asyncio.Event) -> None:
    """The emitter is full: return once at most `resume_level` records are in flight, or on a stop.

    The consumer keeps at most one fetched response per partition meanwhile; pausing would discard it
    (aiokafka drops the buffered records of a paused partition), so partitions are paused only when the
    emitter stays full for `PAUSE_AFTER_S` (a slow engine), and resumed once it drained to half.
    Event loop; the fetch loop is the only caller.
    """
    drained = await emitter.wait_room(resume_level, PAUSE_AFTER_S)
    if not drained and not stop.is_set():
        source.pause_all()
        await emitter.wait_room(emitter.capacity // 2, None)
        if not stop.is_set():
            source.resume_all()
