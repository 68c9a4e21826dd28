"""Running a broker-talking command (`produce`, `tail`, `dlq replay`): bounded, quiet, interruptible.

`run_client(main, bootstrap=..., timeout_s=...)` runs one coroutine on a fresh event loop and turns what can
go wrong talking to Kafka into one line and an exit code:

- an unreachable broker: `CommandError` (exit 1) after at most `timeout_s` (aiokafka alone retries a dead
  broker for minutes), naming the bootstrap servers and the setting that chooses them;
- any other `KafkaError`: its message once (aiokafka's `str()` already starts with the type name);
- Ctrl-C: `asyncio.run` cancels the coroutine at once; clients are closed within `CLOSE_TIMEOUT_S` each
  (`started`), then `KeyboardInterrupt` reaches `consumer.cli.main` (exit 130).

aiokafka's own log lines (one per failed connection attempt) are silenced meanwhile: the failure is reported
once, by the command. `started` closes a client even when its start failed, so no
"Unclosed AIOKafkaProducer" warning is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from consumer.commands import CommandError, UsageError

if TYPE_CHECKING:
    from consumer.settings import Settings

_T = TypeVar("_T")
_C = TypeVar("_C", bound="_Client")

#: Seconds one client may take to close (flush, leave the group) when the command ends or is interrupted.
CLOSE_TIMEOUT_S = 5.0
#: Default bound for a whole command that should finish quickly (produce, dlq replay, tail without --follow).
DEFAULT_TIMEOUT_S = 30.0


class _Client(Protocol):
    async def start(self) -> None: ...


class BrokerUnreachableError(CommandError):
    """No answer from the bootstrap servers within the command's bound (exit 1)."""


def unreachable(bootstrap: str, seconds: float) -> BrokerUnreachableError:
    """The one-line error for a broker that did not answer within `seconds`."""
    return BrokerUnreachableError(
        f"Kafka at {bootstrap} did not answer within {seconds:g} s; is the broker running? "
        "(CLEF_KAFKA__BOOTSTRAP_SERVERS or --bootstrap choose it, --timeout the bound)"
    )


@contextlib.asynccontextmanager
async def started(
    client: _C, close: Callable[[], Awaitable[Any]], *, bootstrap: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> AsyncIterator[_C]:
    """Start `client` (raising `BrokerUnreachableError` when that takes over `timeout_s`: aiokafka waits
    up to its request timeout on a broker that accepts connections but never answers), yield it, and always
    close it with `close` (also when `start` failed or the task was cancelled), waiting at most
    `CLOSE_TIMEOUT_S`."""
    try:
        try:
            async with asyncio.timeout(timeout_s):
                await client.start()
        except TimeoutError as exc:
            raise unreachable(bootstrap, timeout_s) from exc
        yield client
    finally:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(close(), CLOSE_TIMEOUT_S)


def run_client(main: Callable[[], Coroutine[Any, Any, _T]], *, bootstrap: str, timeout_s: float | None) -> _T:
    """Run `main()` on a new event loop (blocking) and return its result; see the module docstring.

    `timeout_s` bounds the whole coroutine (None: no bound, e.g. `tail --follow`; connecting is then still
    bounded by aiokafka's own bootstrap, which fails at once on a refused connection). Raises
    `CommandError` (exit 1) for Kafka failures and `KeyboardInterrupt` on Ctrl-C.
    """
    from aiokafka.errors import KafkaConnectionError, KafkaError

    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        return asyncio.run(_bounded(main(), timeout_s, bootstrap))
    except KafkaConnectionError as exc:
        raise CommandError(f"cannot reach Kafka at {bootstrap}: {_kafka_text(exc)}") from exc
    except KafkaError as exc:
        raise CommandError(f"Kafka at {bootstrap}: {_kafka_text(exc)}") from exc
    finally:
        quiet.setLevel(level)


async def _bounded(coro: Awaitable[_T], timeout_s: float | None, bootstrap: str) -> _T:
    """`coro` within `timeout_s`; only this bound's expiry becomes `BrokerUnreachableError` (a
    `TimeoutError` of the command's own propagates unchanged). The loop reports callback errors through
    `drop_invalid_state`."""
    asyncio.get_running_loop().set_exception_handler(drop_invalid_state)
    bound = asyncio.timeout(timeout_s)
    try:
        async with bound:
            return await coro
    except TimeoutError as exc:
        if bound.expired():
            raise unreachable(bootstrap, timeout_s or 0) from exc
        raise


def drop_invalid_state(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A command's event-loop exception handler: a callback's `InvalidStateError` is dropped, anything else
    goes to the loop's default handler (a log line).

    Ctrl-C cancels the command from `asyncio.run`'s SIGINT handler, which runs between two bytecodes of
    whatever is running. When that is the loop's socket-connect callback, between its `fut.done()` check and
    its `fut.set_result(None)`, the callback finds its future cancelled under it, and asyncio would print
    "Exception in callback ..._sock_connect_cb ... InvalidStateError" after the command's one line. The
    error means a callback set a future that was already done; any callback's is dropped, not only that one's
    (the handle's name is asyncio's internals)."""
    if isinstance(context.get("exception"), asyncio.InvalidStateError):
        return
    loop.default_exception_handler(context)


def _kafka_text(exc: BaseException) -> str:
    """aiokafka's message on one line (its `str()` already names the type)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def error_text(exc: BaseException) -> str:
    """`Type: message` on one line, without naming the type twice when the message already starts with it
    (aiokafka's errors do)."""
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    if not text:
        return name
    return text if text.startswith(name) else f"{name}: {text}"


def load_cli_settings(args: argparse.Namespace, **overrides: Any) -> Settings:
    """Settings for a command: `--config`, `--bootstrap` when the command has them, and the environment.
    Raises `UsageError` (exit 2) for an unknown or invalid setting."""
    from consumer.settings import SettingsError, load_settings

    if getattr(args, "bootstrap", None):
        overrides.setdefault("kafka", {})["bootstrap_servers"] = args.bootstrap
    try:
        return load_settings(getattr(args, "config", None), **overrides)
    except SettingsError as exc:
        raise UsageError(str(exc)) from exc


def add_kafka_options(p: argparse.ArgumentParser) -> None:
    """Add `--config`, `--bootstrap` and `--timeout`: how a client command finds and waits for the broker."""
    p.add_argument("--config", type=Path, default=None, help="TOML settings file (env CLEF_* overrides it)")
    p.add_argument(
        "--bootstrap", default=None, help="Kafka bootstrap servers (default: CLEF_KAFKA__BOOTSTRAP_SERVERS)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"give up after this many seconds, e.g. when the broker is down (default {DEFAULT_TIMEOUT_S:g})",
    )
