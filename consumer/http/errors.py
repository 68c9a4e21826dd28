"""Error answers of the HTTP API, in the two shapes of SPEC sections 2 and 8.

Validation failures (a body that is not JSON, not an object, or empty included) are 422
`{"detail": [{"type", "loc": ["body", ...], "msg"}]}`; everything else is `{"detail": {"error_type",
"message"}}`: `ApiError` raised by the routes, `RequestError` from parsing, the router's 404/405 (with
`Allow`, HEAD listed where GET is), and a JSON 500 for anything unexpected (logged, never echoed).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from consumer.logging import get_logger
from schemas.errors import DlqReason, RequestError

log = get_logger("consumer.http.app")

_STATUS_TYPES = {
    400: "bad_request",
    401: "authentication_error",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
    503: "unavailable",
}
# 422 `detail` entries for the parse failures that pydantic reports without a field location.
_BODY_ERRORS = {
    DlqReason.bad_json: ("json_invalid", "JSON decode error"),
    DlqReason.not_an_object: ("model_attributes_type", "Input should be a valid dictionary or object"),
    DlqReason.empty_value: ("missing", "Field required"),
}


class ApiError(Exception):
    """An error answered as `{"detail": {"error_type", "message"}}` with `status` and extra `headers`."""

    def __init__(
        self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = headers or {}


def error_response(
    status: int, error_type: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    """A JSON error response in the `ErrorBody` shape."""
    return JSONResponse(
        {"detail": {"error_type": error_type, "message": message}}, status_code=status, headers=headers
    )


def request_error_response(exc: RequestError) -> Response:
    """The HTTP answer to a `RequestError`: 422 with `loc` under `"body"` for validation failures (a body
    that is not JSON, not an object or empty included), 413 for an oversized value, else its own status
    with `{"detail": {"error_type", "message"}}`."""
    if exc.errors is not None:
        items = [{**item, "loc": ["body", *item["loc"]]} for item in exc.errors]
        return JSONResponse({"detail": items}, status_code=422)
    body_error = _BODY_ERRORS.get(exc.reason)
    if body_error is not None:
        kind, msg = body_error
        detail = f"{msg}: {exc.message}" if exc.reason == DlqReason.bad_json else msg
        return JSONResponse({"detail": [{"type": kind, "loc": ["body"], "msg": detail}]}, status_code=422)
    status = 413 if exc.reason == DlqReason.value_too_large else exc.status
    return error_response(status, exc.reason.value, exc.message)


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every exception into one of the two error shapes."""

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.error_type, exc.message, exc.headers)

    async def on_request_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestError)
        return request_error_response(exc)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        error_type = _STATUS_TYPES.get(exc.status_code, "http_error")
        message = {404: "no such route", 405: "method not allowed for this route"}.get(
            exc.status_code, str(exc.detail)[:200]
        )
        headers = dict(exc.headers or {})
        allow = headers.get("Allow")
        if allow is not None and "GET" in allow.split(", ") and "HEAD" not in allow:
            headers["Allow"] = f"{allow}, HEAD"  # the HEAD twin of a GET route is a route of its own
        return error_response(exc.status_code, error_type, message, headers)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        items = [
            {"type": str(e.get("type")), "loc": list(e.get("loc", ("body",))), "msg": str(e.get("msg"))}
            for e in exc.errors()[:20]
        ]
        return JSONResponse({"detail": items}, status_code=422)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.error("http_unhandled", error=repr(exc)[:300], path=request.url.path)
        return error_response(500, "internal_error", "internal server error")

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestError, on_request_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_unexpected)
