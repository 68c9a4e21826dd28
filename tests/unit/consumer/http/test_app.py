"""The ASGI app on a fake backend (in-process, httpx's ASGI transport): routes, status codes, error shapes,
auth, body limits and encodings, overload, OpenAPI."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from backports.zstd import compress as zstd_compress
from pydantic import SecretStr

from consumer.http.app import create_app
from consumer.metrics import Metrics
from consumer.settings import HttpSettings, PrioritySettings
from engine.batching.split import EngineError
from schemas.errors import DlqReason, RequestError
from schemas.systemone import SystemOneRequest, SystemOneResponse, build_response, parse_request

OK = {"state": "disk full", "questions": {"outage": {"type": "noul"}}}


class FakeBackend:
    def __init__(self) -> None:
        self.is_ready = True
        self.is_healthy = True
        self.gate: asyncio.Event | None = None
        self.bodies: list[bytes] = []
        self.priorities: list[int | None] = []

    async def answer(
        self,
        body: bytes,
        check: Callable[[SystemOneRequest], None] | None = None,
        priority: int | None = None,
    ) -> SystemOneResponse:
        self.bodies.append(body)
        self.priorities.append(priority)
        if self.gate is not None:
            await self.gate.wait()
        request = parse_request(body)
        if check is not None:
            check(request)
        if request.state == "explode":
            raise EngineError(DlqReason.engine_failed, RuntimeError("boom"), 1)
        if request.state == "too-long":
            raise RequestError(DlqReason.context_length_exceeded, "input is 70000 tokens")
        probs = {qid: [0.25, 0.75] for qid in request.questions}
        return build_response(request, probs, input_tokens=5)

    def ready(self) -> bool:
        return self.is_ready

    def healthy(self) -> bool:
        return self.is_healthy


def client(
    backend: FakeBackend | None = None, priority: PrioritySettings | None = None, **settings: Any
) -> httpx.AsyncClient:
    app = create_app(
        HttpSettings(**settings),
        backend or FakeBackend(),
        Metrics(),
        "clef-omni",
        priority=priority or PrioritySettings(),
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def assert_error(response: httpx.Response, status: int, error_type: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert len(response.headers["x-typesafe-request-id"]) == 32
    detail = response.json()["detail"]
    assert detail["error_type"] == error_type
    assert isinstance(detail["message"], str)
    assert detail["message"]


def assert_validation(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/json"
    detail = response.json()["detail"]
    assert isinstance(detail, list)
    assert detail
    for item in detail:
        assert set(item) == {"type", "loc", "msg"}
        assert item["loc"][0] == "body"
    return detail


async def test_answer_has_json_and_request_id() -> None:
    async with client() as c:
        r = await c.post("/v1/systemone", json=OK)
        r2 = await c.post("/v1/systemone", json=OK)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {
        "model": "clef-omni",
        "answers": {"outage": {"type": "noul", "noul": 0.25}},
        "usage": {"input_tokens": 5, "output_tokens": 0},
    }
    assert r.headers["x-typesafe-request-id"] != r2.headers["x-typesafe-request-id"]


async def test_validation_errors_are_422_under_body() -> None:
    async with client() as c:
        missing = await c.post("/v1/systemone", json={"questions": OK["questions"]})
        empty_questions = await c.post("/v1/systemone", json={"state": "x", "questions": {}})
        not_json = await c.post("/v1/systemone", content=b'{"state": "x", "questions": {')
        array = await c.post("/v1/systemone", content=b"[1, 2]")
        empty = await c.post("/v1/systemone", content=b"")
        score_map = await c.post(
            "/v1/systemone",
            json={"state": "x", "questions": {"s": {"type": "score", "criteria": {"0": "a", "1": "b"}}}},
        )
    assert assert_validation(missing)[0]["loc"] == ["body", "state"]
    assert assert_validation(empty_questions)[0]["loc"] == ["body", "questions"]
    assert assert_validation(not_json)[0]["type"] == "json_invalid"
    assert assert_validation(array)[0]["loc"] == ["body"]
    assert assert_validation(empty)[0]["type"] == "missing"
    assert assert_validation(score_map)[0]["loc"][:3] == ["body", "questions", "s"]


async def test_other_client_errors_and_engine_failure() -> None:
    async with client() as c:
        too_long = await c.post("/v1/systemone", json={**OK, "state": "too-long"})
        boom = await c.post("/v1/systemone", json={**OK, "state": "explode"})
        alias = await c.post("/v1/systemone", json={**OK, "model": "jev-latest"})
        unknown = await c.post("/v1/systemone", json={**OK, "model": "gpt-4"})
    assert_error(too_long, 400, "context_length_exceeded")
    assert_error(boom, 500, "engine_failed")
    assert alias.status_code == 200
    assert alias.json()["model"] == "jev-latest"
    assert_error(unknown, 404, "model_not_found")


async def test_routes_404_405_and_head() -> None:
    async with client() as c:
        unknown_post = await c.post("/v1/nothing", json=OK)
        unknown_get = await c.get("/nothing")
        get_systemone = await c.get("/v1/systemone")
        post_models = await c.post("/v1/models")
        head = await c.head("/readyz")
    assert_error(unknown_post, 404, "not_found")
    assert_error(unknown_get, 404, "not_found")
    assert_error(get_systemone, 405, "method_not_allowed")
    assert get_systemone.headers["allow"] == "POST"
    assert_error(post_models, 405, "method_not_allowed")
    assert post_models.headers["allow"] == "GET, HEAD"
    assert head.status_code == 200
    assert "x-typesafe-request-id" in head.headers


async def test_models_lists_the_model_and_the_jev_alias() -> None:
    async with client(model_release_date="2026-10-01") as c:
        r = await c.get("/v1/models")
    assert r.status_code == 200
    models = r.json()["models"]
    assert [m["name"] for m in models] == ["clef-omni", "jev-latest"]
    assert all(set(m) == {"name", "description", "release_date"} for m in models)
    assert models[0]["release_date"] == "2026-10-01"


async def test_auth_off_ignores_the_header_and_on_checks_it() -> None:
    async with client() as c:
        r = await c.post("/v1/systemone", json=OK, headers={"Authorization": "Bearer whatever"})
    assert r.status_code == 200
    keys = (SecretStr("k1"), SecretStr("k2"))
    async with client(api_keys=keys) as c:
        missing = await c.post("/v1/systemone", json=OK)
        wrong = await c.post("/v1/systemone", json=OK, headers={"Authorization": "Bearer nope"})
        basic = await c.get("/v1/models", headers={"Authorization": "Basic k1"})
        good = await c.post("/v1/systemone", json=OK, headers={"Authorization": "Bearer k2"})
        models = await c.get("/v1/models", headers={"Authorization": "Bearer k1"})
        health = await c.get("/healthz")
    for bad in (missing, wrong, basic):
        assert_error(bad, 401, "authentication_error")
        assert bad.headers["www-authenticate"] == "Bearer"
    assert good.status_code == 200
    assert models.status_code == 200
    assert health.status_code == 200


async def test_body_limit_and_encodings() -> None:
    body = json.dumps(OK).encode()
    async with client(max_body_bytes=200) as c:
        big = await c.post("/v1/systemone", content=b" " * 201 + body)
        gz = await c.post("/v1/systemone", content=gzip.compress(body), headers={"content-encoding": "gzip"})
        bomb = await c.post(
            "/v1/systemone",
            content=gzip.compress(body + b" " * 100_000),
            headers={"content-encoding": "gzip"},
        )
        corrupt = await c.post("/v1/systemone", content=b"\x1f\x8bxx", headers={"content-encoding": "gzip"})
        brotli = await c.post("/v1/systemone", content=body, headers={"content-encoding": "br"})
        zstd = await c.post(
            "/v1/systemone", content=zstd_compress(body), headers={"content-encoding": "zstd"}
        )
        zstd_bomb = await c.post(
            "/v1/systemone",
            content=zstd_compress(body + b" " * 100_000),
            headers={"content-encoding": "zstd"},
        )
    assert_error(big, 413, "request_too_large")
    assert gz.status_code == 200
    assert_error(bomb, 413, "request_too_large")
    assert_error(corrupt, 400, "bad_request")
    assert_error(brotli, 415, "unsupported_media_type")
    assert zstd.status_code == 200
    assert_error(zstd_bomb, 413, "request_too_large")


async def test_overload_is_503_with_retry_after_and_never_hangs() -> None:
    backend = FakeBackend()
    backend.gate = asyncio.Event()
    async with client(backend, max_concurrent_requests=2, retry_after_s=3) as c:
        held = [asyncio.create_task(c.post("/v1/systemone", json=OK)) for _ in range(2)]
        for _ in range(200):  # both requests reach the backend
            if len(backend.bodies) == 2:
                break
            await asyncio.sleep(0.005)
        assert len(backend.bodies) == 2
        over = await asyncio.wait_for(c.post("/v1/systemone", json=OK), 5)
        backend.gate.set()
        done = await asyncio.wait_for(asyncio.gather(*held), 5)
        after = await c.post("/v1/systemone", json=OK)
    assert_error(over, 503, "overloaded")
    assert over.headers["retry-after"] == "3"
    assert [r.status_code for r in done] == [200, 200]
    assert after.status_code == 200


async def test_health_and_readiness() -> None:
    backend = FakeBackend()
    async with client(backend) as c:
        assert (await c.get("/healthz")).json() == {"status": "ok"}
        assert (await c.get("/readyz")).json() == {"status": "ready"}
        backend.is_ready = False
        backend.is_healthy = False
        not_ready = await c.get("/readyz")
        stalled = await c.get("/healthz")
    assert (not_ready.status_code, not_ready.json()) == (503, {"status": "not_ready"})
    assert (stalled.status_code, stalled.json()) == (503, {"status": "stalled"})


async def test_metrics_count_requests_by_route() -> None:
    async with client() as c:
        await c.post("/v1/systemone", json=OK)
        await c.get("/nothing")
        text = (await c.get("/metrics")).text
    assert 'clef_router_http_requests_total{path="/v1/systemone",status="200"} 1.0' in text
    assert 'clef_router_http_requests_total{path="other",status="404"} 1.0' in text
    assert "clef_router_http_request_seconds_count" in text


async def test_openapi_documents_the_real_schemas_and_docs_page() -> None:
    async with client() as c:
        doc = (await c.get("/openapi.json")).json()
        docs = await c.get("/docs")
    post = doc["paths"]["/v1/systemone"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SystemOneRequest"
    }
    schemas = doc["components"]["schemas"]
    for name in ("SystemOneRequest", "SystemOneResponse", "ChoiceQuestion", "ScoreAnswer", "ModelList"):
        assert name in schemas
    assert post["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/SystemOneResponse"
    )
    assert post["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ValidationBody"
    )
    assert "head" not in doc["paths"]["/readyz"]
    assert docs.status_code == 200
    assert "swagger" in docs.text.lower()
    assert not any(path.startswith("/docs") for path in doc["paths"])


async def test_docs_page_loads_only_assets_the_service_serves() -> None:
    """/docs works offline: every URL its HTML references is a path on this server, and each one is
    served (non-empty, with its content type); other names under the asset path are 404."""
    async with client() as c:
        page = await c.get("/docs")
        referenced = re.findall(r"""(?:src|href)=["']([^"']+)["']|url: ?'([^']+)'""", page.text)
        urls = [a or b for a, b in referenced]
        assets = {url: await c.get(url) for url in urls}
        missing = await c.get("/docs/assets/index.html")
        escape = await c.get("/docs/assets/..%2F__init__.py")
        head = await c.head("/docs/assets/swagger-ui.css")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert len(urls) == 4, urls  # stylesheet, icon, script, OpenAPI document
    assert all(url.startswith("/") and not url.startswith("//") for url in urls), urls
    for url, response in assets.items():
        assert response.status_code == 200, url
        assert response.content, url
    assert "/openapi.json" in urls
    assert assets["/docs/assets/swagger-ui-bundle.js"].headers["content-type"].startswith("text/javascript")
    assert b"SwaggerUIBundle" in assets["/docs/assets/swagger-ui-bundle.js"].content
    assert assets["/docs/assets/swagger-ui.css"].headers["content-type"].startswith("text/css")
    assert missing.status_code == 404
    assert escape.status_code == 404
    assert head.status_code == 200


@pytest.mark.parametrize("path", ["/v1/systemone", "/v1/models"])
async def test_auth_applies_before_anything_else(path: str) -> None:
    async with client(api_keys=(SecretStr("k"),), max_body_bytes=10) as c:
        r = await c.request("POST" if path.endswith("one") else "GET", path, content=b"x" * 50)
    assert_error(r, 401, "authentication_error")


async def test_priority_header_sets_the_class_and_the_http_class_is_the_default() -> None:
    backend = FakeBackend()
    async with client(backend, priority=PrioritySettings(levels=4, http=1, default=3)) as c:
        plain = await c.post("/v1/systemone", json=OK)
        urgent = await c.post("/v1/systemone", json=OK, headers={"X-Clef-Priority": "0"})
        lowest = await c.post("/v1/systemone", json=OK, headers={"x-clef-priority": " 3 "})
    assert [r.status_code for r in (plain, urgent, lowest)] == [200, 200, 200]
    assert backend.priorities == [1, 0, 3]


# b"\xb2" reads as "²" (latin-1), which str.isdigit() accepts and int() refuses
@pytest.mark.parametrize("value", ["3", "-1", "1.5", "high", "", "0x1", b"\xb2", "9" * 5000])
async def test_a_bad_priority_header_is_400_and_never_reaches_the_backend(value: str | bytes) -> None:
    backend = FakeBackend()
    async with client(backend) as c:  # levels 3: classes 0..2
        r = await c.post("/v1/systemone", json=OK, headers={"X-Clef-Priority": value})
    assert_error(r, 400, "invalid_priority")
    assert "X-Clef-Priority" in r.json()["detail"]["message"]
    assert "0..2" in r.json()["detail"]["message"]
    assert len(r.json()["detail"]["message"]) < 200  # a long value is not echoed whole
    assert backend.bodies == []


async def test_openapi_documents_the_priority_header() -> None:
    async with client(priority=PrioritySettings(levels=5, http=2, default=4)) as c:
        doc = (await c.get("/openapi.json")).json()
    (param,) = doc["paths"]["/v1/systemone"]["post"]["parameters"]
    assert (param["name"], param["in"], param["required"]) == ("X-Clef-Priority", "header", False)
    assert param["schema"] == {"type": "integer", "minimum": 0, "maximum": 4, "default": 2}
