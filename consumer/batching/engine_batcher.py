"""The one way the service puts an engine behind a `Batcher` (the Kafka pipeline and `serve` share it).

The engine is reached only through `engine.types.ServingEngine` (typed, torch-free): its batch limits, its
staged calls, its `execute` for split retries and its own out-of-memory check. The consumer never imports
torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from consumer.batching.batcher import Batcher
from consumer.metrics import Metrics
from consumer.settings import Settings
from engine.types import PreparedLike, ServingEngine
from schemas.parse import RequestLimits, parse_request
from schemas.request import SystemOneRequest
from schemas.response import SystemOneResponse

__all__ = ["RequestCheck", "answer_body", "engine_batcher"]

RequestCheck = Callable[[SystemOneRequest], None]

P = TypeVar("P", bound=PreparedLike)
S = TypeVar("S")
R = TypeVar("R")


def engine_batcher(settings: Settings, engine: ServingEngine[P, S, R], metrics: Metrics) -> Batcher[P, S, R]:
    """A batcher over `engine` (its limits, staged calls and out-of-memory check) configured from
    `settings` (mode, waits, pools, single-record attempts). Not started; the caller owns its lifecycle."""
    return Batcher(
        engine, settings.batching, metrics=metrics, single_attempts=settings.engine.single_record_attempts
    )


async def answer_body(
    batcher: Batcher[P, S, R],
    engine: ServingEngine[P, S, R],
    limits: RequestLimits,
    body: bytes,
    check: RequestCheck | None = None,
    *,
    priority: int,
) -> SystemOneResponse:
    """Answer one SystemOne request body through `batcher` (event loop), in priority class `priority`. The
    body is parsed, `check`ed (e.g. the HTTP API's model-name check) and prepared in the batcher's prepare
    thread; what any of them raises is re-raised here: `RequestError` (client error), `EngineError` (the
    engine failed on it alone), `RuntimeError` (the batcher is closing), `ValueError` (a class the batcher
    does not have)."""

    def prepare(raw: bytes) -> P:
        request = parse_request(raw, limits)
        if check is not None:
            check(request)
        return engine.prepare(request)

    (outcome,) = await batcher.submit(prepare, [body], priority=priority)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome
