"""Subcommands of the ``clef-router`` CLI, one module per area.

Contract for a command module ``consumer/commands/<name>.py`` (listed in ``consumer.cli.COMMAND_MODULES``):

    def register(commands: Commands) -> None:
        p = commands.add_parser("run", help="...", description="...")
        p.add_argument(...)
        p.set_defaults(func=_run)          # _run(args: argparse.Namespace) -> int (the exit code)

    # subcommands of a group go under that group's subparsers, e.g. ``clef-router dlq replay``:
    def register(commands: Commands) -> None:
        p = commands.group("dlq", "Dead-letter topic tools").add_parser("replay", help="...")
        p.set_defaults(func=_replay)

Handlers raise ``UsageError`` for bad input (exit 2) and ``CommandError`` for other expected failures
(exit 1); ``consumer.cli.main`` turns any exception into one line on stderr. Import heavy packages (torch,
transformers) inside handlers, not at module level, so ``clef-router --help`` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["CommandError", "Commands", "UsageError"]


class CommandError(Exception):
    """An expected failure of a command: printed as one line, exit code ``exit_code`` (default 1)."""

    exit_code: int = 1

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(CommandError):
    """Bad arguments or invalid input: exit code 2."""

    exit_code = 2


class Commands:
    """What ``register`` receives: adds top-level subcommands and gives access to shared groups.

    ``add_parser`` adds a top-level subcommand (same signature as argparse's ``add_parser``).
    ``group`` gives the subparsers object of a group, created on first use, so several modules can add
    subcommands to one group.
    """

    def __init__(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        self._subparsers = subparsers
        self._groups: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """Add a top-level subcommand ``clef-router NAME`` and return its parser."""
        if "help" in kwargs and "description" not in kwargs:
            kwargs["description"] = kwargs["help"]
        return self._subparsers.add_parser(name, **kwargs)

    def group(self, name: str, help_text: str) -> argparse._SubParsersAction[argparse.ArgumentParser]:
        """Return the subparsers of the group ``clef-router NAME ...``, creating the group once."""
        found = self._groups.get(name)
        if found is None:
            parser = self._subparsers.add_parser(name, help=help_text, description=help_text)
            found = parser.add_subparsers(dest=f"{name}_command", metavar="COMMAND", title="commands")
            found.required = True
            self._groups[name] = found
        return found
