"""Stand-ins of the batcher tests: records that name themselves, and a full `engine.types.ServingEngine`
over them that notes every batch, step and thread, raises where a test asks it to, and answers with
responses that carry the record's name."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from engine.batching.cut import BatchLimits
from engine.types import Between, RunsWhenLaunched
from schemas.errors import DlqReason, RequestError
from schemas.request import SystemOneRequest
from schemas.response import SystemOneResponse, Usage

LIMITS = BatchLimits(max_tokens=1000, max_records=4)
"""The fake engine's default limits: four records of the default ten tokens fill a batch."""


@dataclass(frozen=True)
class Item:
    name: str
    num_tokens: int = 10


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError (the engine's `out_of_memory` tells it apart, not the batcher)."""


def answer(item: Item) -> SystemOneResponse:
    """The response of `item`: its name in `model`, `answer:<name>` (these tests follow records only)."""
    return SystemOneResponse(
        model=f"answer:{item.name}", answers={}, usage=Usage(input_tokens=item.num_tokens)
    )


def said(outcomes: Sequence[SystemOneResponse | BaseException]) -> list[str | BaseException]:
    """Each outcome as the name its response carries (`answer:<name>`); exceptions stay as they are."""
    return [o.model if isinstance(o, SystemOneResponse) else o for o in outcomes]


def ident(item: Item) -> Item:
    """The prepare function of these tests: the item itself; names starting with "bad" fail to prepare."""
    if item.name.startswith("bad"):
        raise RequestError(DlqReason.bad_json, "nope")
    return item


def items(*names: str) -> list[Item]:
    return [Item(name) for name in names]


class FakeEngine(RunsWhenLaunched[list[Item], list[SystemOneResponse]]):
    """A `ServingEngine` over `Item`s within `limits`. `stage` and `respond` hand the batch through; `run`
    (the GPU thread) and `execute` (the split path) answer it. Notes every batch that reached the GPU
    (`batches`), those `execute` ran (`executed`), each step with its thread (`steps`), and the threads
    `out_of_memory` was asked on for an OOM (`oom_calls`). A batch holding a `fail_on` name raises
    ValueError; one of more than `oom_above` records raises `OutOfMemoryError`."""

    def __init__(
        self,
        limits: BatchLimits = LIMITS,
        *,
        fail_on: set[str] | None = None,
        oom_above: int | None = None,
    ) -> None:
        self.limits = limits
        self.fail_on = fail_on or set()
        self.oom_above = oom_above
        self.batches: list[list[str]] = []
        self.executed: list[list[str]] = []
        self.steps: list[tuple[str, str]] = []
        self.oom_calls: list[str] = []
        self.in_lane: list[tuple[str, list[str]]] = []
        self._lane = threading.local()

    def _note(self, step: str, batch: Sequence[Item] = ()) -> None:
        self.steps.append((step, threading.current_thread().name))
        if getattr(self._lane, "depth", 0):
            self.in_lane.append((step, [i.name for i in batch]))

    @contextlib.contextmanager
    def _in_lane(self) -> Iterator[None]:
        self._lane.depth = getattr(self._lane, "depth", 0) + 1
        try:
            yield
        finally:
            self._lane.depth -= 1

    def lane(self) -> AbstractContextManager[None]:
        """Steps taken inside it, on the thread that entered it, are noted in `in_lane` with their batch."""
        return self._in_lane()

    def _answer(self, batch: Sequence[Item]) -> list[SystemOneResponse]:
        self.batches.append([i.name for i in batch])
        if self.oom_above is not None and len(batch) > self.oom_above:
            raise OutOfMemoryError("CUDA out of memory")
        if any(i.name in self.fail_on for i in batch):
            raise ValueError("poisoned batch")
        return [answer(i) for i in batch]

    def prepare(self, request: SystemOneRequest) -> Item:
        return Item(request.model)

    def stage(self, batch: Sequence[Item]) -> list[Item]:
        self._note("stage", batch)
        return list(batch)

    def run(self, staged: list[Item], between: Between | None = None) -> list[SystemOneResponse]:
        self._note("run", staged)
        return self._answer(staged)

    def respond(self, ran: list[SystemOneResponse]) -> list[SystemOneResponse]:
        self._note("respond")
        return ran

    def execute(self, batch: Sequence[Item]) -> list[SystemOneResponse]:
        self._note("execute")
        self.executed.append([i.name for i in batch])
        return self._answer(batch)

    def out_of_memory(self, exc: BaseException) -> bool:
        oom = isinstance(exc, OutOfMemoryError)
        if oom:
            self.oom_calls.append(threading.current_thread().name)
        return oom
