"""`RequestContext`: the outermost ASGI layer of the HTTP API.

It gives every HTTP response an `x-typesafe-request-id` header (a fresh random id per request, the header
the official SDK reports in its errors), counts requests by route and status, and observes each request's
time from start to the end of its response. Being outside the framework, it also covers the framework's
own error responses (a 500 from an unexpected exception included). Plain ASGI, so it costs one wrapped
`send` per request and nothing per body chunk beyond a type check.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from consumer.metrics import Metrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

REQUEST_ID_HEADER = b"x-typesafe-request-id"
KNOWN_PATHS = frozenset(
    {"/v1/systemone", "/v1/models", "/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"}
)
DOCS_ASSETS_PREFIX = "/docs/assets/"  # counted as one path label, whatever the file


def _path_label(path: str) -> str:
    """The metrics label of a request path: a known route, `/docs/assets`, or `other` (bounded set)."""
    if path in KNOWN_PATHS:
        return path
    return DOCS_ASSETS_PREFIX.rstrip("/") if path.startswith(DOCS_ASSETS_PREFIX) else "other"


def new_request_id() -> str:
    """A random 128-bit request id as 32 hex characters."""
    return os.urandom(16).hex()


class RequestContext:
    """Wraps `app`; see the module docstring. `app` is kept as `.app` (tests reach the FastAPI app)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                message["headers"] = [*message.get("headers", ()), (REQUEST_ID_HEADER, request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            path = scope.get("path", "")
            self._metrics.http_requests.labels(path=_path_label(path), status=str(status)).inc()
            self._metrics.http_seconds.observe(time.perf_counter() - started)
