"""Minimal asyncio HTTP/1.1 server: SystemOne API, health, readiness and Prometheus metrics.

Routes: `POST /v1/systemone` (answered on the same batcher as Kafka, so HTTP and Kafka requests share GPU
batches), `GET /v1/models`, `GET /healthz` (progress watchdog), `GET /readyz` (model loaded, partitions
assigned), `GET /metrics`. Optional Bearer keys protect `/v1/*`. Bodies need a `Content-Length` (chunked
uploads get 411); keep-alive is supported; header reads and idle connections time out. A bad request is
always a 4xx (`RequestError.body()`); an engine failure is a 500; overload is a 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from collections.abc import Sequence
from typing import Protocol

from consumer.logging import get_logger
from consumer.metrics import CONTENT_TYPE, Metrics
from consumer.retry import EngineError
from consumer.settings import HttpSettings
from schemas.errors import RequestError
from schemas.systemone import SystemOneResponse

log = get_logger("consumer.http")

MAX_HEADER_BYTES = 16 * 1024
MAX_HEADERS = 100
HEADER_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 60.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_ROUTES = ("/v1/systemone", "/v1/models", "/healthz", "/readyz", "/metrics")


class Backend(Protocol):
    """What the server needs from the service (`consumer.pipeline.Pipeline` provides it)."""

    async def answer(self, body: bytes) -> SystemOneResponse: ...

    def ready(self) -> bool: ...

    def healthy(self) -> bool: ...


class _BadRequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


Response = tuple[int, bytes, str, list[tuple[str, str]]]


def _error(status: int, error_type: str, message: str) -> Response:
    body = json.dumps({"detail": {"error_type": error_type, "message": message}}).encode()
    return status, body, "application/json", []


def _json(status: int, obj: object) -> Response:
    return status, json.dumps(obj).encode(), "application/json", []


class HttpServer:
    """Start with `start()` (returns the bound port), stop with `stop()`."""

    def __init__(
        self, settings: HttpSettings, backend: Backend, metrics: Metrics, model_names: Sequence[str]
    ):
        self._settings = settings
        self._backend = backend
        self._metrics = metrics
        self._models = list(model_names)
        self._keys = [key.get_secret_value().encode() for key in settings.api_keys]
        self._slots = asyncio.Semaphore(settings.max_concurrent_requests)
        self._server: asyncio.Server | None = None
        self.port: int | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(
            self._connection, self._settings.host, self._settings.port, limit=MAX_HEADER_BYTES
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("http_listening", host=self._settings.host, port=self.port, auth=bool(self._keys))
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), IDLE_TIMEOUT_S)
                except (TimeoutError, ConnectionError, asyncio.LimitOverrunError, ValueError):
                    return
                if not line:
                    return
                try:
                    method, path, version, headers, body = await asyncio.wait_for(
                        self._read_request(line, reader), HEADER_TIMEOUT_S
                    )
                except _BadRequestError as exc:
                    await self._write(writer, _error(exc.status, "bad_request", str(exc)), close=True)
                    return
                except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
                    return
                response = await self._route(method, path, headers, body)
                self._metrics.http_requests.labels(
                    path=path if path in _ROUTES else "other", status=str(response[0])
                ).inc()
                connection = headers.get("connection", "").lower()
                close = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
                await self._write(writer, response, close=close)
                if close:
                    return
        finally:
            writer.close()

    async def _read_request(
        self, line: bytes, reader: asyncio.StreamReader
    ) -> tuple[str, str, str, dict[str, str], bytes]:
        parts = line.decode("latin-1").strip().split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequestError(400, "malformed request line")
        method, target, version = parts
        headers: dict[str, str] = {}
        while True:
            raw = await reader.readline()
            if raw in (b"\r\n", b"\n", b""):
                break
            if len(headers) >= MAX_HEADERS:
                raise _BadRequestError(400, "too many headers")
            name, sep, value = raw.decode("latin-1").partition(":")
            if not sep:
                raise _BadRequestError(400, "malformed header")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise _BadRequestError(411, "chunked request bodies are not supported; send Content-Length")
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            raise _BadRequestError(400, "bad Content-Length") from None
        if length < 0:
            raise _BadRequestError(400, "bad Content-Length")
        if length > self._settings.max_body_bytes:
            raise _BadRequestError(413, f"body larger than {self._settings.max_body_bytes} bytes")
        body = await reader.readexactly(length) if length else b""
        return method, target.split("?", 1)[0], version, headers, body

    def _authorized(self, headers: dict[str, str]) -> bool:
        if not self._keys:
            return True
        scheme, _, token = headers.get("authorization", "").partition(" ")
        given = token.strip().encode()
        return scheme.lower() == "bearer" and any(hmac.compare_digest(given, key) for key in self._keys)

    async def _route(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Response:
        if path.startswith("/v1/") and not self._authorized(headers):
            status, payload, ctype, _ = _error(401, "unauthorized", "missing or invalid Bearer key")
            return status, payload, ctype, [("WWW-Authenticate", "Bearer")]
        if path == "/v1/systemone":
            return (
                await self._systemone(body)
                if method == "POST"
                else _error(405, "method_not_allowed", "use POST")
            )
        if method not in ("GET", "HEAD"):
            return _error(405 if path in _ROUTES else 404, "method_not_allowed", "use GET")
        if path == "/v1/models":
            data = [
                {"id": name, "object": "model", "created": 0, "owned_by": "cloudflare"}
                for name in self._models
            ]
            return _json(200, {"object": "list", "data": data})
        if path == "/healthz":
            ok = self._backend.healthy()
            return _json(200 if ok else 503, {"status": "ok" if ok else "stalled"})
        if path == "/readyz":
            ok = self._backend.ready()
            return _json(200 if ok else 503, {"status": "ready" if ok else "not_ready"})
        if path == "/metrics":
            return 200, self._metrics.render(), CONTENT_TYPE, []
        return _error(404, "not_found", "no such route")

    async def _systemone(self, body: bytes) -> Response:
        if self._slots.locked():
            status, payload, ctype, _ = _error(503, "overloaded", "too many concurrent requests")
            return status, payload, ctype, [("Retry-After", "1")]
        async with self._slots:
            try:
                response = await self._backend.answer(body)
            except RequestError as exc:
                return exc.status, json.dumps(exc.body()).encode(), "application/json", []
            except EngineError as exc:
                log.warning("http_engine_failed", reason=exc.reason.value, error=type(exc.cause).__name__)
                return _error(500, exc.reason.value, "the engine failed on this request")
            except RuntimeError as exc:  # batcher closing during shutdown
                return _error(503, "unavailable", str(exc)[:100])
        return 200, response.to_json(), "application/json", []

    async def _write(self, writer: asyncio.StreamWriter, response: Response, *, close: bool) -> None:
        status, body, ctype, extra = response
        lines = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
            f"Content-Type: {ctype}",
            f"Content-Length: {len(body)}",
            f"Connection: {'close' if close else 'keep-alive'}",
        ]
        lines += [f"{name}: {value}" for name, value in extra]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
