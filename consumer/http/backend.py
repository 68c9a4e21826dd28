"""The one protocol the HTTP app (`consumer.http.app`) needs from the service behind it.

Implemented by `consumer.pipeline.pipeline.Pipeline` (Kafka and HTTP on one batcher) and by the backends of
`consumer.http.backends` (`HttpService` for `serve`, `ServiceBackend` for `run`).
"""

from __future__ import annotations

from typing import Protocol

from consumer.batching.engine_batcher import RequestCheck
from schemas.response import SystemOneResponse


class Backend(Protocol):
    """Answers request bodies and says whether the service is ready and healthy. Event loop only."""

    async def answer(
        self, body: bytes, check: RequestCheck | None = None, priority: int | None = None
    ) -> SystemOneResponse:
        """Answer one request body in the batcher's class `priority` (None: the HTTP class,
        `batching.priority.http`; the app checks a requested class against `batching.priority.levels`);
        `check` sees the parsed request before the engine (prepare thread) and what it raises is
        re-raised. Raises `RequestError` (client error), `EngineError` (the engine failed on it alone),
        `RuntimeError` (stopping)."""
        ...

    def ready(self) -> bool:
        """True while the service takes traffic (`GET /readyz`). Non-blocking."""
        ...

    def healthy(self) -> bool:
        """False when the service is stuck or failed (`GET /healthz`). Non-blocking."""
        ...
