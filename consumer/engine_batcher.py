"""The one way the service puts an engine behind a `Batcher` (the Kafka pipeline and `serve` share it)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from consumer.batcher import Batcher, EngineLike, staged_calls
from consumer.metrics import Metrics
from consumer.settings import Settings
from schemas.parse import RequestLimits, parse_request
from schemas.request import SystemOneRequest
from schemas.response import SystemOneResponse

RequestCheck = Callable[[SystemOneRequest], None]


def _empty_cuda_cache() -> None:
    # Called by the batcher after a CUDA OOM; torch is looked up only if the engine already imported it,
    # so the consumer never imports torch itself.
    torch: Any = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def engine_batcher(
    settings: Settings, engine: EngineLike[Any], metrics: Metrics
) -> Batcher[Any, SystemOneResponse]:
    """A batcher over `engine` configured from `settings` (batching limits, single-record attempts, OOM
    handling, staged calls when the engine offers them). Not started; the caller owns its lifecycle."""
    return Batcher(
        engine.execute,
        settings.batching,
        metrics=metrics,
        single_attempts=settings.engine.single_record_attempts,
        on_oom=_empty_cuda_cache,
        stages=staged_calls(engine),
    )


async def answer_body(
    batcher: Batcher[Any, SystemOneResponse],
    engine: EngineLike[Any],
    limits: RequestLimits,
    body: bytes,
    check: RequestCheck | None = None,
) -> SystemOneResponse:
    """Answer one SystemOne request body through `batcher` (event loop). The body is parsed, `check`ed
    (e.g. the HTTP API's model-name check) and prepared in the batcher's prepare thread; what any of them
    raises is re-raised here: `RequestError` (client error), `EngineError` (the engine failed on it alone),
    `RuntimeError` (the batcher is closing)."""

    def prepare(raw: bytes) -> Any:
        request = parse_request(raw, limits)
        if check is not None:
            check(request)
        return engine.prepare(request)

    (outcome,) = await batcher.submit(prepare, [body])
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome
