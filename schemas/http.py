"""HTTP-only wire models of the SystemOne API (SPEC section 8): the model list and the error bodies.

The request and response bodies themselves are `schemas.request.SystemOneRequest` and
`schemas.response.SystemOneResponse`; these models describe what only the HTTP API returns, so its OpenAPI
document shows the real shapes. All are plain data: no behaviour, no internal imports beyond `schemas`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

JEV_ALIAS = "jev-latest"
"""The model name the official SDKs send by default; accepted as an alias of the served model."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, json_schema_serialization_defaults_required=True)


class ModelInfo(_Frozen):
    """One entry of `GET /v1/models` (Jev's shape)."""

    name: str = Field(description="model name or alias accepted in a request's `model` field")
    description: str
    release_date: str = Field(description="YYYY-MM-DD, or empty when not configured")


class ModelList(_Frozen):
    """`GET /v1/models`: `{"models": [{"name", "description", "release_date"}]}`."""

    models: list[ModelInfo]


class ErrorDetail(_Frozen):
    """A non-validation error: a stable `error_type` code and a short, payload-free message."""

    error_type: str = Field(description="stable code, e.g. authentication_error, bad_request, overloaded")
    message: str


class ErrorBody(_Frozen):
    """Every non-validation 4xx/5xx body: `{"detail": {"error_type", "message"}}`."""

    detail: ErrorDetail


class ValidationItem(_Frozen):
    """One validation failure; `loc` starts with `"body"` followed by field names and indices."""

    type: str
    loc: list[str | int]
    msg: str


class ValidationBody(_Frozen):
    """A 422 body: `{"detail": [{"type", "loc", "msg"}, ...]}` (never echoes the input)."""

    detail: list[ValidationItem]


class HealthStatus(_Frozen):
    """`/healthz` and `/readyz` bodies."""

    status: Literal["ok", "stalled", "ready", "not_ready"]
