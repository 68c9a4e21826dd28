"""Per-partition contiguous commit watermark (at-least-once bookkeeping).

Fetched records are `track`ed in offset order, one record or one run of consecutive fetched records (a
span `[offset, end)`) at a time; when all outputs (or DLQ records) of a span are acknowledged it is marked
`done` by its first offset. `committable()` gives, per partition, the offset to commit: the first offset of
the oldest span not yet done (or the end of the last tracked span when nothing is pending), so a commit
never covers a record whose outputs are not acknowledged. Offsets may have gaps (compaction, transaction
markers); a span covers the gaps inside it, which hold no records to consume. Pure and synchronous; not
thread-safe (event loop only).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

P = TypeVar("P", bound=Hashable)


@dataclass(slots=True)
class _Partition:
    pending: deque[int] = field(default_factory=deque)  # first offsets of the spans not yet released
    done: set[int] = field(default_factory=set)  # first offsets of finished spans still in `pending`
    next_offset: int | None = None  # end of the last tracked span
    committed: int | None = None  # last offset handed out by `committable` and confirmed by `mark_committed`

    def watermark(self) -> int | None:
        while self.pending and self.pending[0] in self.done:
            self.done.discard(self.pending.popleft())
        if self.pending:
            return self.pending[0]
        return self.next_offset


class OffsetTracker(Generic[P]):
    """Tracks in-flight offsets of many partitions (keys of any hashable type, e.g. `TopicPartition`)."""

    def __init__(self) -> None:
        self._parts: dict[P, _Partition] = {}

    def track(self, partition: P, offset: int, end: int | None = None) -> None:
        """Register a fetched record (`end` None) or the span of fetched records `[offset, end)`.

        Spans of one partition must be tracked in increasing order. Raises `ValueError` on a span starting
        below the end of the previous one (a re-fetch must `forget` first) or an empty span.
        """
        stop = offset + 1 if end is None else end
        if stop <= offset:
            raise ValueError(f"empty span [{offset}, {stop}) of {partition!r}")
        part = self._parts.get(partition)
        if part is None:
            part = self._parts[partition] = _Partition()
        if part.next_offset is not None and offset < part.next_offset:
            raise ValueError(f"offset {offset} of {partition!r} tracked out of order")
        part.pending.append(offset)
        part.next_offset = stop

    def done(self, partition: P, offset: int) -> None:
        """Mark the record or span tracked at `offset` finished (outputs acknowledged). Unknown partitions
        are ignored."""
        part = self._parts.get(partition)
        if part is not None:
            part.done.add(offset)

    def pending(self, partition: P | None = None) -> int:
        """Records or spans tracked and not yet done, in one partition or in all."""
        parts = self._parts.values() if partition is None else [self._parts.get(partition, _Partition())]
        total = 0
        for part in parts:
            part.watermark()
            total += len(part.pending) - len(part.done)
        return total

    def committable(self) -> dict[P, int]:
        """Offsets that may be committed now, only for partitions that advanced since the last commit."""
        out: dict[P, int] = {}
        for key, part in self._parts.items():
            mark = part.watermark()
            if mark is not None and (part.committed is None or mark > part.committed):
                out[key] = mark
        return out

    def mark_committed(self, offsets: dict[P, int]) -> None:
        """Record that `offsets` were committed (so `committable` stops returning them)."""
        for key, offset in offsets.items():
            part = self._parts.get(key)
            if part is not None and (part.committed is None or offset > part.committed):
                part.committed = offset

    def committed(self) -> dict[P, int]:
        """The last committed offset per partition (partitions never committed are left out)."""
        return {key: part.committed for key, part in self._parts.items() if part.committed is not None}

    def forget(self, partition: P) -> None:
        """Drop a partition (revoked): its pending records will never be committed by this member."""
        self._parts.pop(partition, None)

    def partitions(self) -> list[P]:
        return list(self._parts)
