"""`Pipeline.answer` (HTTP) through the shared batcher: one submission of one record, errors raised."""

from __future__ import annotations

import json

import pytest

from bench.pipeline import StubEngine
from consumer.pipeline import Pipeline
from consumer.settings import load_settings
from schemas.errors import RequestError


async def test_answer_returns_the_response_and_raises_request_errors() -> None:
    settings = load_settings(http={"enabled": False}, batching={"max_wait_ms": 0})
    pipeline = Pipeline(settings, StubEngine())
    await pipeline.batcher.start()
    try:
        body = {"state": {"summary": "disk full"}, "questions": {"ok": {"type": "noul", "question": "ok?"}}}
        response = await pipeline.answer(json.dumps(body).encode())
        assert list(response.answers) == ["ok"]
        with pytest.raises(RequestError):
            await pipeline.answer(b"not json")
    finally:
        await pipeline.batcher.close(1.0)
