"""Priority classes of the batcher's ready queue: the order in which waiting records are offered to a batch.

Class 0 is the most urgent; a record's class is fixed when it is submitted (HTTP requests and priority
topics get low numbers, the bulk Kafka input the highest). Records are offered class by class, first in
first out inside a class, so the next batch takes the most urgent work first and fills the rest of its
budget from the classes below.

Starvation bound: a class that has records waiting but gets none into a batch is "passed over". Once it
has been passed over `starvation_batches` batches in a row, it is offered first (ahead of every class
that is not starving) until one of its records rides in a batch. A waiting record of any class therefore
waits for at most `starvation_batches` batches of more urgent work per class above it before its class
heads the order; `ClassQueues.passed` exposes the counters.

Pure and single-threaded (the batcher calls it on the event loop); it never looks inside a job.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

J = TypeVar("J")


@dataclass(frozen=True, slots=True)
class ClassPolicy:
    """`levels` classes (0 = most urgent, `levels - 1` = least); a waiting class heads the order after
    being passed over by `starvation_batches` consecutive batches. Raises `ValueError` for a bound or a
    level count below 1."""

    levels: int = 3
    starvation_batches: int = 8

    def __post_init__(self) -> None:
        if self.levels < 1 or self.starvation_batches < 1:
            raise ValueError("levels and starvation_batches must be at least 1")


class ClassQueues(Generic[J]):
    """One FIFO per class and the starvation counters (the batcher is its one writer)."""

    def __init__(self, policy: ClassPolicy) -> None:
        self.policy = policy
        self._queues: list[deque[J]] = [deque() for _ in range(policy.levels)]
        self._passed = [0] * policy.levels
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, level: int, job: J) -> None:
        """Queue `job` at the tail of class `level`. Raises `ValueError` for a level out of range."""
        if not 0 <= level < self.policy.levels:
            raise ValueError(f"priority class {level} is outside 0..{self.policy.levels - 1}")
        self._queues[level].append(job)
        self._size += 1

    @property
    def passed(self) -> tuple[int, ...]:
        """Per class, how many batches in a row passed over its waiting records (0 for an empty class)."""
        return tuple(self._passed)

    def waiting(self, level: int) -> int:
        """Records waiting in class `level`."""
        return len(self._queues[level])

    def _class_order(self) -> list[int]:
        bound = self.policy.starvation_batches
        levels = range(self.policy.levels)
        starving = [c for c in levels if self._queues[c] and self._passed[c] >= bound]
        return starving + [c for c in levels if c not in starving]

    def offered(self) -> Iterator[tuple[int, J]]:
        """(class, job) in the order the next batch takes them; lazy, so a caller reads only what fits."""
        for c in self._class_order():
            for job in self._queues[c]:
                yield c, job

    def head(self, limit: int) -> list[tuple[int, J]]:
        """The first `limit` of `offered()`."""
        return list(itertools.islice(self.offered(), limit))

    def head_of(self, levels: range, limit: int) -> list[J]:
        """The first `limit` jobs of the classes in `levels`, class order, FIFO inside a class."""
        chained = itertools.chain.from_iterable(self._queues[c] for c in levels)
        return list(itertools.islice(chained, limit))

    def take_from(self, levels: range, count: int) -> list[J]:
        """Remove and return the first `count` jobs of `head_of(levels, ...)` (an extra batch beside the
        regular ones: the starvation counters stay as they are). Raises `ValueError` when fewer wait."""
        if count > sum(len(self._queues[c]) for c in levels):
            raise ValueError(f"{count} records asked for from classes {list(levels)}, fewer waiting")
        taken: list[J] = []
        for c in levels:
            queue = self._queues[c]
            while queue and len(taken) < count:
                taken.append(queue.popleft())
        self._size -= count
        return taken

    def take(self, count: int) -> list[J]:
        """Remove and return the first `count` offered jobs (the batch just cut), and count every class
        that had records waiting and got none into it as passed over once more. Raises `ValueError` when
        fewer than `count` jobs wait."""
        if count > self._size:
            raise ValueError(f"{count} records asked for, {self._size} waiting")
        taken: list[J] = []
        served: set[int] = set()
        for c in self._class_order():
            queue = self._queues[c]
            while queue and len(taken) < count:
                taken.append(queue.popleft())
                served.add(c)
        self._size -= count
        for c in range(self.policy.levels):
            if c in served or not self._queues[c]:
                self._passed[c] = 0
            else:
                self._passed[c] += 1
        return taken

    def drain(self) -> list[J]:
        """Remove and return every waiting job (class order, FIFO inside a class)."""
        jobs = [job for queue in self._queues for job in queue]
        for queue in self._queues:
            queue.clear()
        self._passed = [0] * self.policy.levels
        self._size = 0
        return jobs
