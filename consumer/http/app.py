"""The SystemOne HTTP API as an ASGI app (FastAPI on Starlette), served by uvicorn (`consumer.http.server`).

Routes: `POST /v1/systemone` (answered by the backend's shared batcher, so HTTP and Kafka requests share GPU
batches), `GET /v1/models` (Jev's `{"models": [...]}`; `jev-latest` is listed as an alias), `GET /healthz`
(progress watchdog), `GET /readyz`, `GET /metrics`, `GET /openapi.json` and `GET /docs` (Swagger UI with its
assets served here, `consumer.http.docs`: it works offline). GET routes also
answer HEAD (the server sends no body). Optional Bearer keys protect `/v1/*`.

Errors (SPEC sections 2 and 8; shapes in `consumer.http.errors`): validation failures, a body that is
not JSON or not an object included, are 422 `{"detail": [{"type", "loc": ["body", ...], "msg"}]}`;
every other error is `{"detail": {"error_type", "message"}}`: 401 `authentication_error`, 404
`not_found`, 405 with `Allow`, 413, 415, 404 `model_not_found` (a model that is neither the served one
nor `jev-latest`), 400 other client errors, 503 `overloaded` with `Retry-After` beyond
`max_concurrent_requests` in flight, 500 only when the engine failed on the request alone.
Every response carries `x-typesafe-request-id`.

Priority: a SystemOne request runs in the batcher's HTTP class (`batching.priority.http`) unless it sends
`X-Clef-Priority: N`, an integer class in `0..batching.priority.levels - 1` (0 the most urgent); any other
value is 400 `invalid_priority`. The header is documented in the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response

from consumer.http.backend import Backend
from consumer.http.body import BodyError, read_body
from consumer.http.docs import install_docs
from consumer.http.errors import ApiError, install_error_handlers
from consumer.http.middleware import RequestContext
from consumer.logging import get_logger
from consumer.metrics import CONTENT_TYPE, Metrics
from consumer.settings import HttpSettings, PrioritySettings
from engine.batching.split import EngineError
from schemas.http import (
    JEV_ALIAS,
    ErrorBody,
    HealthStatus,
    ModelInfo,
    ModelList,
    ValidationBody,
)
from schemas.request import SystemOneRequest
from schemas.response import SystemOneResponse

log = get_logger("consumer.http.app")

JSON = "application/json"
PRIORITY_HEADER = "X-Clef-Priority"


class _Api:
    """The route handlers and the state they share (event loop only)."""

    def __init__(
        self,
        settings: HttpSettings,
        backend: Backend,
        metrics: Metrics,
        model_name: str,
        priority: PrioritySettings,
    ) -> None:
        self.settings = settings
        self.priority = priority
        self.backend = backend
        self.metrics = metrics
        self.keys = [key.get_secret_value().encode() for key in settings.api_keys]
        self.in_flight = 0
        models = [
            ModelInfo(
                name=model_name,
                description=settings.model_description,
                release_date=settings.model_release_date,
            )
        ]
        if model_name != JEV_ALIAS:
            models.append(
                ModelInfo(
                    name=JEV_ALIAS,
                    description=f"Alias of {model_name}",
                    release_date=settings.model_release_date,
                )
            )
        self.models_body = ModelList(models=models).model_dump_json().encode()
        self.model_names = frozenset(m.name for m in models)

    def check_model(self, request: SystemOneRequest) -> None:
        """Raise a 404 `ApiError` unless the request names a served model or alias (prepare thread)."""
        if request.model not in self.model_names:
            shown = request.model[:64]
            raise ApiError(
                404, "model_not_found", f"model {shown!r} is not served; GET /v1/models lists them"
            )

    def check_key(self, request: Request) -> None:
        """Raise a 401 `ApiError` unless auth is off or the Bearer key is one of the configured keys."""
        if not self.keys:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401,
                "authentication_error",
                "missing API key: send Authorization: Bearer <key>",
                {"WWW-Authenticate": "Bearer"},
            )
        given = token.strip().encode()
        if not any(hmac.compare_digest(given, key) for key in self.keys):
            raise ApiError(401, "authentication_error", "invalid API key", {"WWW-Authenticate": "Bearer"})

    def request_class(self, request: Request) -> int:
        """The priority class of a SystemOne request: its `X-Clef-Priority` header, else the HTTP class.
        Raises a 400 `ApiError` (`invalid_priority`) unless the header is an integer in `0..levels - 1`."""
        raw = request.headers.get(PRIORITY_HEADER)
        if raw is None:
            return self.priority.http
        text = raw.strip()
        top = self.priority.levels - 1
        if text.isascii() and text.isdigit() and len(text) <= 3 and int(text) <= top:
            return int(text)
        raise ApiError(
            400,
            "invalid_priority",
            f"{PRIORITY_HEADER} must be an integer class in 0..{top} (0 the most urgent), got {text[:20]!r}",
        )

    async def systemone(self, request: Request) -> Response:
        self.check_key(request)
        priority = self.request_class(request)
        if self.in_flight >= self.settings.max_concurrent_requests:
            raise ApiError(
                503,
                "overloaded",
                "too many requests in flight; retry later",
                {"Retry-After": str(self.settings.retry_after_s)},
            )
        self.in_flight += 1
        self.metrics.http_in_flight.set(self.in_flight)
        try:
            body = await read_body(request, self.settings.max_body_bytes)
            started = time.perf_counter()
            response = await self._answer(body, priority)
            headers = None
            if self.settings.server_timing:
                headers = {"Server-Timing": f"batcher;dur={(time.perf_counter() - started) * 1000:.3f}"}
            return Response(response.to_json(), media_type=JSON, headers=headers)
        except BodyError as exc:
            raise ApiError(exc.status, exc.error_type, str(exc)) from None
        finally:
            self.in_flight -= 1
            self.metrics.http_in_flight.set(self.in_flight)

    async def _answer(self, body: bytes, priority: int) -> SystemOneResponse:
        try:
            return await self.backend.answer(body, self.check_model, priority)
        except EngineError as exc:
            log.warning("http_engine_failed", reason=exc.reason.value, error=type(exc.cause).__name__)
            raise ApiError(500, exc.reason.value, "the engine failed on this request") from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this request itself is being cancelled (server stopping)
            raise ApiError(503, "unavailable", "the service is stopping", {"Retry-After": "1"}) from None
        except RuntimeError as exc:  # the batcher is closing: the service is stopping
            raise ApiError(503, "unavailable", str(exc)[:100], {"Retry-After": "1"}) from None

    async def models(self, request: Request) -> Response:
        self.check_key(request)
        return Response(self.models_body, media_type=JSON)

    async def healthz(self, request: Request) -> Response:
        ok = self.backend.healthy()
        return JSONResponse({"status": "ok" if ok else "stalled"}, status_code=200 if ok else 503)

    async def readyz(self, request: Request) -> Response:
        ok = self.backend.ready()
        return JSONResponse({"status": "ready" if ok else "not_ready"}, status_code=200 if ok else 503)

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)


Handler = Callable[[Request], Awaitable[Response]]
Responses = dict[int | str, dict[str, object]]  # FastAPI's `responses=`: status -> OpenAPI response fields


def _error_responses(codes: Sequence[int]) -> Responses:
    out: Responses = {code: {"model": ErrorBody} for code in codes}
    out[422] = {"model": ValidationBody, "description": "validation failure (body not JSON included)"}
    return out


def create_app(
    settings: HttpSettings,
    backend: Backend,
    metrics: Metrics,
    model_name: str,
    *,
    priority: PrioritySettings,
) -> RequestContext:
    """The ASGI app: FastAPI routes wrapped in `RequestContext` (request id header and metrics on every
    response, errors of the framework itself included). `priority` is the batcher's classes
    (`batching.priority`: the HTTP class and the range `X-Clef-Priority` may ask for). Call once per
    server; cheap."""
    api = _Api(settings, backend, metrics, model_name, priority)
    app = FastAPI(
        title="clef-router SystemOne API",
        version="1",
        description="SystemOne decisions (noul, choice, score) by the Clef-omni model; Jev-compatible.",
        docs_url=None,  # `consumer.http.docs` serves /docs and its assets itself (offline)
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=None,
    )
    install_docs(app)
    auth_codes = [401] if api.keys else []
    _add_systemone_route(app, api, auth_codes)
    _add_get_routes(app, api, auth_codes)
    app.openapi = lambda: _openapi_document(app)  # type: ignore[method-assign]
    install_error_handlers(app)
    return RequestContext(app, metrics)


def _add_systemone_route(app: FastAPI, api: _Api, auth_codes: list[int]) -> None:
    """`POST /v1/systemone`; its body is documented as a `SystemOneRequest` (the handler reads it raw),
    its optional `X-Clef-Priority` header as an integer class."""
    priority = api.priority
    app.add_api_route(
        "/v1/systemone",
        api.systemone,
        methods=["POST"],
        summary="Answer SystemOne questions about a state",
        responses={
            200: {"model": SystemOneResponse, "description": "one answer per question, in request order"},
            **_error_responses([400, *auth_codes, 404, 413, 415, 500, 503]),
        },
        openapi_extra={
            "parameters": [
                {
                    "name": PRIORITY_HEADER,
                    "in": "header",
                    "required": False,
                    "description": "priority class of this request in the batcher, 0 the most urgent "
                    "(FIFO inside a class); another value is 400 invalid_priority",
                    "schema": {
                        "type": "integer",
                        "minimum": 0,
                        "maximum": priority.levels - 1,
                        "default": priority.http,
                    },
                }
            ],
            "requestBody": {
                "required": True,
                "content": {JSON: {"schema": {"$ref": "#/components/schemas/SystemOneRequest"}}},
            },
        },
    )


def _add_get_routes(app: FastAPI, api: _Api, auth_codes: list[int]) -> None:
    """`/v1/models`, `/healthz`, `/readyz`, `/metrics`: each as GET and as HEAD."""
    health: Responses = {200: {"model": HealthStatus}, 503: {"model": HealthStatus}}
    gets: list[tuple[str, Handler, str, Responses]] = [
        (
            "/v1/models",
            api.models,
            "List the served models",
            {200: {"model": ModelList}, **{c: {"model": ErrorBody} for c in auth_codes}},
        ),
        ("/healthz", api.healthz, "Progress watchdog", health),
        ("/readyz", api.readyz, "Ready for traffic", health),
        (
            "/metrics",
            api.metrics_text,
            "Prometheus metrics",
            {200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
        ),
    ]
    for path, handler, summary, responses in gets:
        app.add_api_route(path, handler, methods=["GET"], summary=summary, responses=responses)
        # HEAD runs the GET handler; uvicorn sends the headers only (kept out of the OpenAPI document)
        app.add_api_route(path, handler, methods=["HEAD"], include_in_schema=False)


def _openapi_document(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document (built on first call, then cached on `app`), with `SystemOneRequest` and the
    models it refers to under `components/schemas`. `Any`: FastAPI's JSON document type."""
    if app.openapi_schema is None:
        doc = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        request_schema = SystemOneRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        schemas.update(request_schema.pop("$defs", {}))
        schemas["SystemOneRequest"] = request_schema
        for name in ("NoulQuestion", "ChoiceQuestion", "ScoreQuestion"):
            # a question's `type` has a default in Python, but on the wire it is the union's tag
            required = schemas[name].setdefault("required", [])
            if "type" not in required:
                required.insert(0, "type")
        app.openapi_schema = doc
    return app.openapi_schema
