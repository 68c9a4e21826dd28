"""`HttpServer`: uvicorn serving an ASGI app inside the service's own event loop.

`uvicorn.Server.serve()` would install its own SIGINT/SIGTERM handlers; the service owns those, so this runs
uvicorn's `startup` / `main_loop` / `shutdown` steps itself on a socket it binds itself (a bind failure is
an `OSError` here, not a `SystemExit` inside uvicorn). No lifespan events and no uvicorn logging config:
the service's structlog setup stays in charge. HTTP/1.1 keep-alive (idle connections close after
`keep_alive_s`), and a graceful stop: listening sockets close at once, idle connections close, requests in
progress get up to `shutdown_timeout_s` to finish, then their tasks are cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn
from uvicorn.config import LifespanType

from consumer.http.middleware import ASGIApp
from consumer.logging import get_logger
from consumer.settings import HttpSettings

log = get_logger("consumer.http.server")

_LIFESPAN_OFF: LifespanType = "off"


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port` (port 0: a free one). Raises `OSError` (address in use...)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when the listening
    # socket says TCP; without it a response written in two parts waits for the client's delayed ACK
    # (about 40 ms per request).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class HttpServer:
    """Serve `app` with uvicorn on the running loop: `await start()` returns the bound port, `request_stop()`
    begins a graceful stop (safe from a signal handler), `await stop()` begins it and waits for its end."""

    def __init__(self, settings: HttpSettings, app: ASGIApp) -> None:
        self._settings = settings
        self._config = uvicorn.Config(
            app,
            lifespan=_LIFESPAN_OFF,
            log_config=None,
            access_log=False,
            server_header=False,
            timeout_keep_alive=max(1, round(settings.keep_alive_s)),
            timeout_graceful_shutdown=max(1, round(settings.shutdown_timeout_s)),
            ws="none",
        )
        self._server = uvicorn.Server(self._config)
        self._sockets: list[socket.socket] = []
        self._task: asyncio.Task[None] | None = None
        self.port: int | None = None

    async def start(self) -> int:
        """Bind, start accepting connections, and return the port. Raises `OSError` when binding fails."""
        sock = bind_socket(self._settings.host, self._settings.port)
        self._sockets = [sock]
        self._config.load()
        # `Server.serve` sets `lifespan` before calling `startup`; with lifespan "off" it is a no-op object.
        self._server.lifespan = self._config.lifespan_class(self._config)
        await self._server.startup(sockets=self._sockets)
        self.port = int(sock.getsockname()[1])
        self._task = asyncio.create_task(self._run(), name="clef-http")
        log.info(
            "http_listening",
            host=self._settings.host,
            port=self.port,
            auth=bool(self._settings.api_keys),
            max_concurrent_requests=self._settings.max_concurrent_requests,
        )
        return self.port

    async def _run(self) -> None:
        try:
            await self._server.main_loop()  # ticks every 0.1 s (Date header) until should_exit
        finally:
            await self._server.shutdown(sockets=self._sockets)
            log.info("http_stopped")

    def request_stop(self) -> None:
        """Begin the graceful stop (non-blocking; idempotent)."""
        self._server.should_exit = True

    async def stop(self) -> None:
        """Graceful stop; returns when every connection is closed (at most about `shutdown_timeout_s`)."""
        self.request_stop()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
