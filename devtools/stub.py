"""`StubEngine`, an engine that answers instantly, and `sample_event`, a realistic alert event.

Used by the pipeline benchmark (`bench.pipeline`), `clef-router run/serve --stub-engine` and the tests that
exercise the Kafka side without a model.
"""

from __future__ import annotations

import contextlib
import json
import zlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import pydantic_core

from engine.batching.cut import SERVICE_LIMITS, BatchLimits
from engine.types import Between, RunsWhenLaunched
from schemas.request import SystemOneRequest, option_table
from schemas.response import SystemOneResponse, build_response


@dataclass(frozen=True, slots=True)
class StubPrepared:
    """A prepared record of the stub: its request and a token count that grows with its questions."""

    request: SystemOneRequest
    num_tokens: int


class StubEngine(RunsWhenLaunched[Sequence[StubPrepared], list[SystemOneResponse]]):
    """An `engine.types.ServingEngine` that answers instantly: deterministic, state-dependent probabilities.
    Its staged calls do all the work in `run` (`stage` and `respond` hand the batch through). `limits` are
    the batch limits a batcher cuts its batches by (default: the service's).

    Responses are cached per (questions object, variant), so the cost per record is a dictionary lookup
    for events of the default schema (whose questions object is shared).
    """

    VARIANTS = 7

    def __init__(self, limits: BatchLimits = SERVICE_LIMITS) -> None:
        self.limits = limits
        self._cache: dict[tuple[int, int], tuple[object, SystemOneResponse]] = {}

    def prepare(self, request: SystemOneRequest) -> StubPrepared:
        return StubPrepared(request, 200 + 20 * len(request.questions))

    def execute(self, batch: Sequence[StubPrepared]) -> list[SystemOneResponse]:
        return [self._answer(p) for p in batch]

    def stage(self, batch: Sequence[StubPrepared]) -> Sequence[StubPrepared]:
        return batch

    def run(self, staged: Sequence[StubPrepared], between: Between | None = None) -> list[SystemOneResponse]:
        return self.execute(staged)

    def respond(self, ran: list[SystemOneResponse]) -> list[SystemOneResponse]:
        return ran

    def out_of_memory(self, exc: BaseException) -> bool:
        return False

    def lane(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()  # no device: nothing to queue behind

    def _answer(self, p: StubPrepared) -> SystemOneResponse:
        variant = zlib.crc32(pydantic_core.to_json(p.request.state)) % self.VARIANTS
        key = (id(p.request.questions), variant)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is p.request.questions:
            return (
                hit[1].model_copy(update={"model": p.request.model})
                if hit[1].model != p.request.model
                else hit[1]
            )
        probs: dict[str, list[float]] = {}
        for i, (qid, question) in enumerate(p.request.questions.items()):
            n = len(option_table(question))
            top = (variant + i) % n
            rest = 0.2 / (n - 1)
            probs[qid] = [0.8 if k == top else rest for k in range(n)]
        response = build_response(p.request, probs, input_tokens=p.num_tokens)
        if len(self._cache) < 10_000:
            self._cache[key] = (p.request.questions, response)
        return response


def sample_event(i: int) -> bytes:
    """A realistic small alert event (about 300 bytes)."""
    kinds = [
        "disk full on /var",
        "BGP session down",
        "replication lag 45s",
        "TLS certificate expires in 2 days",
        "HTTP 5xx rate 12%",
        "UPS on battery",
        "suspicious login from new ASN",
    ]
    return json.dumps(
        {
            "event_id": f"ev-{i}",
            "source": "monitoring",
            "host": f"host-{i % 97}.dc{i % 3}",
            "summary": kinds[i % len(kinds)],
            "severity": ["info", "warning", "critical"][i % 3],
            "metrics": {"value": i % 1000, "threshold": 900},
            "ts": "2026-11-29T12:00:00Z",
        }
    ).encode()
