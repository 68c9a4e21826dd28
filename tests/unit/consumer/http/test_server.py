"""uvicorn inside the loop, on 127.0.0.1: keep-alive, HEAD, graceful stop, bind errors; and `HttpService`
(the `serve` backend) with the stub engine through its own batcher."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from consumer.http.app import create_app
from consumer.http.backends import HttpService, ServiceBackend
from consumer.http.server import HttpServer, bind_socket
from consumer.metrics import Metrics
from consumer.settings import HttpSettings, PrioritySettings, load_settings
from devtools.stub import StubEngine
from tests.unit.consumer.http.test_app import OK, FakeBackend


async def read_response(
    reader: asyncio.StreamReader, *, head: bool = False
) -> tuple[int, dict[str, str], bytes]:
    status_line = await reader.readline()
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    length = 0 if head else int(headers.get("content-length", "0"))
    body = await reader.readexactly(length)
    return int(status_line.split()[1]), headers, body


def post(body: bytes) -> bytes:
    head = f"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def started(backend: object, **settings: object) -> HttpServer:
    http = HttpSettings(port=0, **settings)  # type: ignore[arg-type]
    app = create_app(http, backend, Metrics(), "clef-omni", priority=PrioritySettings())  # type: ignore[arg-type]
    server = HttpServer(http, app)
    await server.start()
    return server


async def test_keep_alive_and_head_on_one_connection() -> None:
    server = await started(FakeBackend())
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = await read_response(reader, head=True)
        assert status == 200
        assert int(headers["content-length"]) > 0  # the GET's length, no body bytes follow
        writer.write(post(json.dumps(OK).encode()))
        status, headers, body = await asyncio.wait_for(read_response(reader), 5)
        assert status == 200  # the HEAD left no stray bytes: the next response parses on the same socket
        assert json.loads(body)["answers"]["outage"]["type"] == "noul"
        assert "x-typesafe-request-id" in headers
        writer.close()
    finally:
        await server.stop()


async def test_graceful_stop_finishes_requests_in_progress() -> None:
    backend = FakeBackend()
    backend.gate = asyncio.Event()
    server = await started(backend, shutdown_timeout_s=5)
    port = server.port
    assert port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(json.dumps(OK).encode()))
    for _ in range(200):
        if backend.bodies:
            break
        await asyncio.sleep(0.01)
    stopping = asyncio.create_task(server.stop())
    await asyncio.sleep(0.3)
    assert not stopping.done()  # waits for the request in progress
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)  # no longer accepting
    backend.gate.set()
    status, _, _ = await asyncio.wait_for(read_response(reader), 5)
    assert status == 200
    assert await asyncio.wait_for(reader.read(), 5) == b""  # then the server closes the connection
    await asyncio.wait_for(stopping, 5)
    writer.close()


async def test_port_in_use_is_an_os_error() -> None:
    first = await started(FakeBackend())
    try:
        second = HttpServer(
            HttpSettings(port=first.port or 0),
            create_app(HttpSettings(), FakeBackend(), Metrics(), "clef-omni", priority=PrioritySettings()),
        )
        with pytest.raises(OSError, match="in use"):
            await second.start()
    finally:
        await first.stop()


async def test_http_service_answers_through_its_batcher() -> None:
    settings = load_settings(batching={"max_wait_ms": 0}, http={"watchdog_s": 60})
    service = HttpService(settings, StubEngine())
    assert not service.ready()
    await service.start()
    try:
        assert service.ready()
        assert service.healthy()
        response = await service.answer(json.dumps(OK).encode())
        assert list(response.answers) == ["outage"]
        service.request_stop()
        assert not service.ready()
    finally:
        await service.close(5)
    with pytest.raises(RuntimeError):
        await service.answer(json.dumps(OK).encode())


async def test_http_service_answers_in_the_http_class_unless_given_one() -> None:
    settings = load_settings(batching={"max_wait_ms": 0, "priority": {"http": 1}})
    service = HttpService(settings, StubEngine())
    seen: list[int | None] = []
    submit = service.batcher.submit

    def recording(prepare: Any, items: Any, *, priority: int | None = None) -> Any:
        seen.append(priority)
        return submit(prepare, items, priority=priority)

    service.batcher.submit = recording  # type: ignore[method-assign]
    await service.start()
    try:
        await service.answer(json.dumps(OK).encode())
        await ServiceBackend(service, Reach()).answer(json.dumps(OK).encode(), None, 2)
    finally:
        await service.close(5)
    assert seen == [1, 2]


class Reach:
    def __init__(self) -> None:
        self.up = True

    def reachable(self) -> bool:
        return self.up


async def test_run_readiness_needs_the_broker() -> None:
    pipeline, broker = FakeBackend(), Reach()
    server = await started(ServiceBackend(pipeline, broker))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        statuses = []
        for up in (True, False, True):
            broker.up = up
            writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            statuses.append((await read_response(reader))[0])
        writer.close()
    finally:
        await server.stop()
    assert statuses == [200, 503, 200]


def test_listening_socket_says_tcp_so_asyncio_sets_nodelay() -> None:
    # with proto 0 asyncio skips TCP_NODELAY on accepted connections: +40 ms per request (delayed ACK)
    sock = bind_socket("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()
