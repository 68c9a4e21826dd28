"""Transient broker-side failures: what is worth retrying, and the retry policy.

`transient_retry(...)` is a tenacity `AsyncRetrying` with exponential backoff and jitter for broker-side
transient errors (aiokafka errors flagged `retriable`, timeouts, connection errors).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

T = TypeVar("T")
R = TypeVar("R")


def is_transient(exc: BaseException) -> bool:
    """Broker-side errors worth retrying: aiokafka `retriable` errors, timeouts, connection errors."""
    if getattr(exc, "retriable", False):
        return True
    return isinstance(exc, (asyncio.TimeoutError, TimeoutError, ConnectionError))


def transient_retry(
    attempts: int,
    *,
    initial_s: float = 0.1,
    max_s: float = 5.0,
    on_retry: Callable[[RetryCallState], None] | None = None,
) -> AsyncRetrying:
    """Tenacity policy: up to `attempts` tries of transient errors, exponential backoff with jitter.

    Non-transient errors and the last transient one are re-raised unchanged.
    """
    return AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential_jitter(multiplier=initial_s, max=max_s, jitter=initial_s),
        retry=retry_if_exception(is_transient),
        reraise=True,
        before_sleep=on_retry,
    )
