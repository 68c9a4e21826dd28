"""`consumer.commands.client`: the event loop a broker-talking command runs on reports a callback's
`InvalidStateError` (Ctrl-C racing a socket callback) nowhere, and every other callback error as before."""

from __future__ import annotations

import asyncio
import logging

import pytest

from consumer.commands.client import drop_invalid_state, run_client


def test_invalid_state_is_dropped_and_other_errors_logged(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            race = asyncio.InvalidStateError("invalid state")
            drop_invalid_state(loop, {"message": "Exception in callback _sock_connect_cb", "exception": race})
            assert caplog.records == []
            drop_invalid_state(loop, {"message": "Exception in callback other", "exception": ValueError("x")})
    finally:
        loop.close()
    assert [r.getMessage() for r in caplog.records] == ["Exception in callback other"]


def test_a_future_set_after_its_cancel_reaches_no_log_in_a_command(caplog: pytest.LogCaptureFixture) -> None:
    """The race itself, made to happen: a loop callback sets the result of a future the command's task was
    waiting on after the task was cancelled (as the SIGINT handler does between `done()` and `set_result`)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert loop.get_exception_handler() is drop_invalid_state
        fut: asyncio.Future[None] = loop.create_future()
        fut.cancel()
        loop.call_soon(fut.set_result, None)  # raises InvalidStateError inside the loop's callback
        await asyncio.sleep(0.01)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        run_client(main, bootstrap="127.0.0.1:9", timeout_s=5)
    assert [r for r in caplog.records if r.name == "asyncio"] == []
