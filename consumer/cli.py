"""The ``clef-router`` command line (console script ``clef-router = consumer.cli:main``).

Each area's commands live in ``consumer/commands/<name>.py`` and expose ``register(commands)`` (see
``consumer.commands``). ``main`` turns every exception that escapes a command into one line on stderr and a
non-zero exit code: 2 for usage and validation errors, 1 otherwise, 130 for Ctrl-C. Set ``CLEF_DEBUG=1``
to also print the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn, cast

import structlog

from consumer.commands import CommandError, Commands

PROG = "clef-router"
#: Command modules under ``consumer/commands/``, in help order.
COMMAND_MODULES: tuple[str, ...] = ("kafka", "schema", "engine", "service", "produce", "tail", "dlq", "bench")
_MAX_MESSAGE = 400


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _load_command_modules(names: Sequence[str]) -> list[ModuleType]:
    """Import the command modules ``consumer.commands.<name>``; an import failure propagates."""
    return [importlib.import_module(f"consumer.commands.{name}") for name in names]


def build_parser(module_names: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Build the full parser from the command modules (default: ``COMMAND_MODULES``)."""
    parser = _Parser(
        prog=PROG,
        description="Route SystemOne alert and fault events from Kafka with the Clef-omni decision model.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    commands = Commands(cast("argparse._SubParsersAction[argparse.ArgumentParser]", subparsers))
    for module in _load_command_modules(COMMAND_MODULES if module_names is None else module_names):
        register = getattr(module, "register", None)
        if not callable(register):
            raise RuntimeError(f"command module {module.__name__} has no register(commands) function")
        register(commands)
    return parser


def version() -> str:
    """The installed package's version (`unknown` when run from a tree that was never installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("clef-router")
    except PackageNotFoundError:
        return "unknown"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def _is_validation_error(exc: BaseException) -> bool:
    """Pydantic validation errors and SystemOne request errors count as usage errors (exit 2)."""
    from pydantic import ValidationError

    from schemas.systemone import RequestError

    return isinstance(exc, ValidationError | RequestError)


def _describe(exc: BaseException) -> tuple[str, int]:
    """Return the message and the exit code for an exception that escaped a command."""
    if isinstance(exc, CommandError):
        return _one_line(exc), exc.exit_code
    if _is_validation_error(exc):
        return f"invalid input: {_one_line(exc)}", 2
    if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError) and exc.filename:
        return f"{exc.strerror or type(exc).__name__}: {exc.filename}", 1
    text, name = _one_line(exc), type(exc).__name__
    # aiokafka's messages already start with their type name: say it once
    return (text if text.startswith(name) else f"{name}: {text}"), 1


def _stderr_logger(*_args: object) -> structlog.PrintLogger:
    """A structlog logger factory that writes to whatever ``sys.stderr`` is when a logger is made.

    ``PrintLoggerFactory(sys.stderr)`` would pin the stream object current at configuration time; when
    that is a temporary stream (a test's captured stderr, a redirected stream) that is closed later, every
    later log call raises ``ValueError: I/O operation on closed file``, e.g. inside a pydantic validator.
    """
    return structlog.PrintLogger(file=sys.stderr)


class _DropOptionalLibraryNotices(logging.Filter):
    """Drops the loader's "processor not loaded ... requires the Torchvision library" warning: without
    torchvision the engine cuts video frames itself (engine.media.features), so the notice, printed cut off
    mid-sentence on every start, only alarms users. Other warnings of that logger pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "requires the Torchvision library" not in record.getMessage()


def _configure_default_logging() -> None:
    """Send structlog output to stderr (stdout is for command results) unless already configured; silence
    notices about optional libraries."""
    if not structlog.is_configured():
        structlog.configure(logger_factory=_stderr_logger)
    release_log = logging.getLogger("engine.model.release")
    if not any(isinstance(f, _DropOptionalLibraryNotices) for f in release_log.filters):
        release_log.addFilter(_DropOptionalLibraryNotices())


def _command_name(args: argparse.Namespace) -> str:
    """`clef-router dlq replay` for a command of a group (`Commands.group` stores `<group>_command`)."""
    words = [PROG, args.command]
    sub = getattr(args, f"{args.command}_command", None)
    if isinstance(sub, str):
        words.append(sub)
    return " ".join(words)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the chosen command and return its exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    name = PROG
    try:
        parser = build_parser()
        args = parser.parse_args(args_list)
        func = getattr(args, "func", None)
        if func is None:
            parser.print_help(sys.stderr)
            return 2
        name = _command_name(args)
        _configure_default_logging()
        result = func(args)
        return int(result) if result is not None else 0
    except SystemExit as exc:  # argparse (--help, usage errors) and commands that exit on purpose
        code = exc.code
        if code is None or isinstance(code, int):
            return code or 0
        print(f"{name}: error: {code}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1  # stdout closed early (e.g. piped into head): nothing useful to say
    except Exception as exc:
        message, code = _describe(exc)
        print(f"{name}: error: {message}", file=sys.stderr)
        if os.environ.get("CLEF_DEBUG"):
            traceback.print_exc()
        return code


if __name__ == "__main__":
    raise SystemExit(main())
