"""HTTP server on a fake backend: routes, status codes, auth, keep-alive, limits."""

from __future__ import annotations

import asyncio
import json

from pydantic import SecretStr

from consumer.http import HttpServer
from consumer.metrics import Metrics
from consumer.retry import EngineError
from consumer.settings import HttpSettings
from schemas.errors import DlqReason
from schemas.systemone import SystemOneResponse, build_response, parse_request


class FakeBackend:
    def __init__(self) -> None:
        self.is_ready = True
        self.is_healthy = True

    async def answer(self, body: bytes) -> SystemOneResponse:
        request = parse_request(body)
        if request.model == "explode":
            raise EngineError(DlqReason.engine_failed, RuntimeError("boom"), 1)
        probs = {qid: [0.25, 0.75] for qid in request.questions}
        return build_response(request, probs, input_tokens=5)

    def ready(self) -> bool:
        return self.is_ready

    def healthy(self) -> bool:
        return self.is_healthy


async def call(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    status, headers, body = await read_response(reader)
    writer.close()
    return status, headers, body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status_line = await reader.readline()
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers, body


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def new_server() -> HttpServer:
    srv = HttpServer(HttpSettings(port=0, max_body_bytes=2048), FakeBackend(), Metrics(), ["clef-omni"])
    await srv.start()
    return srv


async def test_systemone_ok_and_errors() -> None:
    server = await new_server()
    assert server.port is not None
    ok = json.dumps({"state": "disk full", "questions": {"outage": {"type": "noul"}}}).encode()
    status, headers, body = await call(server.port, post("/v1/systemone", ok))
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["answers"]["outage"] == {"type": "noul", "noul": 0.25}
    status, _, body = await call(server.port, post("/v1/systemone", b'{"state": "x", "questions": {}}'))
    assert status == 422
    assert isinstance(json.loads(body)["detail"], list)
    status, _, body = await call(server.port, post("/v1/systemone", b"{not json"))
    assert status == 400
    assert json.loads(body)["detail"]["error_type"] == "bad_json"
    boom = json.dumps({"model": "explode", "state": "x", "questions": {"q": {"type": "noul"}}}).encode()
    status, _, body = await call(server.port, post("/v1/systemone", boom))
    assert status == 500
    assert json.loads(body)["detail"]["error_type"] == "engine_failed"
    status, _, _ = await call(server.port, post("/v1/systemone", b"x" * 4096))
    assert status == 413
    status, _, _ = await call(
        server.port, b"POST /v1/systemone HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    assert status == 411
    await server.stop()


async def test_get_routes_and_keep_alive() -> None:
    server = await new_server()
    assert server.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    for path in ("/v1/models", "/healthz", "/readyz", "/metrics", "/nope"):
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        status, headers, body = await read_response(reader)
        if path == "/v1/models":
            assert status == 200
            assert json.loads(body)["data"][0]["id"] == "clef-omni"
        elif path == "/metrics":
            assert status == 200
            assert b"clef_router_http_requests_total" in body
        elif path == "/nope":
            assert status == 404
        else:
            assert status == 200
        assert headers["connection"] == "keep-alive"
    writer.close()
    await server.stop()


async def test_health_and_readiness_fail() -> None:
    backend = FakeBackend()
    srv = HttpServer(HttpSettings(port=0), backend, Metrics(), ["m"])
    port = await srv.start()
    backend.is_ready = False
    backend.is_healthy = False
    assert (await call(port, b"GET /readyz HTTP/1.1\r\n\r\n"))[0] == 503
    assert (await call(port, b"GET /healthz HTTP/1.1\r\n\r\n"))[0] == 503
    await srv.stop()


async def test_bearer_keys() -> None:
    srv = HttpServer(HttpSettings(port=0, api_keys=(SecretStr("s3cret"),)), FakeBackend(), Metrics(), ["m"])
    port = await srv.start()
    status, headers, _ = await call(port, b"GET /v1/models HTTP/1.1\r\n\r\n")
    assert status == 401
    assert headers["www-authenticate"] == "Bearer"
    status, _, _ = await call(port, b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer wrong\r\n\r\n")
    assert status == 401
    status, _, _ = await call(port, b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n")
    assert status == 200
    assert (await call(port, b"GET /healthz HTTP/1.1\r\n\r\n"))[0] == 200  # probes need no key
    await srv.stop()
