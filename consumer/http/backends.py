"""Backends of the HTTP app (`consumer.http.backend.Backend`) for `clef-router serve` and `clef-router run`.

- `HttpService` (`serve`): the engine behind its own batcher, no Kafka. Same settings, same engine, same
  batching as `run`. Ready once the batcher runs and until a stop begins; healthy unless requests are in
  flight and none has finished for `http.watchdog_s`.
- `ServiceBackend` (`run`): the pipeline's answer, health and readiness, and readiness also requires the
  broker to have answered within `http.broker_unreachable_s` (`consumer.kafka.broker_watch.BrokerWatch`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from consumer.batching.batcher import Batcher
from consumer.batching.engine_batcher import RequestCheck, answer_body, engine_batcher
from consumer.http.backend import Backend
from consumer.logging import get_logger
from consumer.metrics import Metrics
from consumer.settings import Settings
from engine.types import PreparedLike, ServingEngine
from schemas.parse import RequestLimits
from schemas.response import SystemOneResponse

if TYPE_CHECKING:
    from consumer.http.server import HttpServer

log = get_logger("consumer.http.backends")

P = TypeVar("P", bound=PreparedLike)
S = TypeVar("S")
R = TypeVar("R")


class HttpService(Generic[P, S, R]):
    """The engine behind a batcher of its own, answering request bodies. Event loop only."""

    def __init__(
        self, settings: Settings, engine: ServingEngine[P, S, R], *, metrics: Metrics | None = None
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self._engine = engine
        self._limits = RequestLimits(max_value_bytes=settings.engine.max_message_bytes)
        self.batcher: Batcher[P, S, R] = engine_batcher(settings, engine, self.metrics)
        self._started = False
        self._stopping = False
        self._in_flight = 0
        self._last_progress = time.monotonic()

    async def start(self) -> None:
        """Start the batcher; the service is ready from here on."""
        await self.batcher.start()
        self._started = True
        self.metrics.model_loaded.set(1)

    def request_stop(self) -> None:
        """Turn readiness off (safe from a signal handler); answering continues until `close`."""
        self._stopping = True

    async def close(self, timeout_s: float) -> None:
        """Finish what the batcher holds (at most `timeout_s`), then stop its threads."""
        self._stopping = True
        await self.batcher.close(timeout_s)
        self.metrics.model_loaded.set(0)

    async def answer(
        self, body: bytes, check: RequestCheck | None = None, priority: int | None = None
    ) -> SystemOneResponse:
        """Answer one request body through the batcher in class `priority` (None: `batching.priority.http`);
        `check` sees the parsed request first (prepare thread) and what it raises is re-raised here. Raises
        `RequestError` (client error), `EngineError` (the engine failed on it alone), `RuntimeError` (the
        batcher is closing), `ValueError` (a class outside `0..batching.priority.levels - 1`)."""
        level = self.settings.batching.priority.http if priority is None else priority
        self._in_flight += 1
        try:
            return await answer_body(self.batcher, self._engine, self._limits, body, check, priority=level)
        finally:
            self._in_flight -= 1
            self._last_progress = time.monotonic()

    def ready(self) -> bool:
        return self._started and not self._stopping

    def healthy(self) -> bool:
        idle = self._in_flight == 0
        return idle or time.monotonic() - self._last_progress < self.settings.http.watchdog_s


class _Reachability(Protocol):
    def reachable(self) -> bool: ...


class ServiceBackend:
    """`run`'s backend: the pipeline, with readiness that also needs a reachable broker."""

    def __init__(self, pipeline: Backend, broker: _Reachability) -> None:
        self._pipeline = pipeline
        self._broker = broker

    async def answer(
        self, body: bytes, check: RequestCheck | None = None, priority: int | None = None
    ) -> SystemOneResponse:
        return await self._pipeline.answer(body, check, priority)

    def ready(self) -> bool:
        return self._pipeline.ready() and self._broker.reachable()

    def healthy(self) -> bool:
        return self._pipeline.healthy()


def http_server(settings: Settings, backend: Backend, metrics: Metrics) -> HttpServer:
    """The service's HTTP server over `backend`, not started: the app of `consumer.http.app` with the
    settings' HTTP options, model name and priority classes (`run`, `serve` and the benches build it here).
    Imports the web stack (FastAPI, uvicorn) when called."""
    from consumer.http.app import create_app
    from consumer.http.server import HttpServer

    app = create_app(
        settings.http, backend, metrics, settings.engine.model_name, priority=settings.batching.priority
    )
    return HttpServer(settings.http, app)
