"""The ``clef-router`` CLI: every command has --help; failures are one stderr line and a non-zero exit."""

from __future__ import annotations

import argparse
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from consumer import cli
from consumer.commands import Commands, UsageError


def _subcommand_paths(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _subcommand_paths(sub, (*prefix, name))


ALL_COMMANDS = sorted(_subcommand_paths(cli.build_parser()))


def test_known_commands_are_registered() -> None:
    assert ("kafka-local",) in ALL_COMMANDS
    assert ("schema",) in ALL_COMMANDS


@pytest.mark.parametrize("path", [(), *ALL_COMMANDS], ids=lambda p: " ".join(p) or "clef-router")
def test_help_exits_zero(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*path, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: clef-router")


class _Strict(BaseModel):
    n: int


def _install_fake_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register a module ``consumer.commands._fake`` with failing commands, plus a missing module."""

    def boom(args: argparse.Namespace) -> int:
        raise RuntimeError("boom\nwith a second line that must not become a second line")

    def usage(args: argparse.Namespace) -> int:
        raise UsageError("bad --thing")

    def invalid(args: argparse.Namespace) -> int:
        _Strict.model_validate({"n": "not a number"})
        return 0

    def register(commands: Commands) -> None:
        for name, func in (("boom", boom), ("usage", usage), ("invalid", invalid)):
            commands.add_parser(name, help=name).set_defaults(func=func)
        commands.group("tools", "fake group").add_parser("fake", help="fake tool").set_defaults(func=boom)

    def register_more(commands: Commands) -> None:
        group = commands.group("tools", "fake group")
        group.add_parser("other", help="second module in the group").set_defaults(func=usage)

    fake = types.ModuleType("consumer.commands._fake")
    fake.register = register  # type: ignore[attr-defined]
    more = types.ModuleType("consumer.commands._more")
    more.register = register_more  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setitem(sys.modules, more.__name__, more)
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("kafka", "_fake", "_more"))


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["boom"], 1, "RuntimeError: boom with a second line"),
        (["usage"], 2, "bad --thing"),
        (["invalid"], 2, "invalid input"),
        (["tools", "fake"], 1, "boom"),
        (["tools", "other"], 2, "bad --thing"),
        (["no-such-command"], 2, "invalid choice"),
        (["tools"], 2, "required"),
        (["kafka-local", "--port", "70000"], 2, "--port must be between"),
    ],
)
def test_errors_are_one_line(
    argv: list[str],
    code: int,
    needle: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _install_fake_commands(monkeypatch)
    assert cli.main(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.endswith("\n")
    assert needle in err
    assert "Traceback" not in err
    assert err.startswith("clef-router")


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ("batching", "--set takes SECTION.KEY=VALUE"),
        ("batching.max_batch_records=x", "max_batch_records"),
        ("batching.no_such_key=1", "no_such_key"),
    ],
)
def test_bench_pipeline_rejects_bad_settings_before_starting(
    setting: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["bench", "pipeline", "--set", setting]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert needle in err


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "usage: clef-router" in capsys.readouterr().err


def test_broken_command_module_is_not_silently_skipped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = types.ModuleType("consumer.commands._broken")

    def register(commands: Commands) -> None:
        import a_dependency_that_does_not_exist  # type: ignore[import-not-found]  # noqa: F401

    broken.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, broken.__name__, broken)
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("_broken",))
    assert cli.main(["--help"]) == 1
    err = capsys.readouterr().err
    assert "a_dependency_that_does_not_exist" in err
    assert err.count("\n") == 1


def test_schema_command_prints_both_schemas(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert cli.main(["schema", "--indent", "0"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert {"request", "response"} <= set(printed)
    assert "questions" in printed["request"]["properties"]
    assert "answers" in printed["response"]["properties"]


def test_default_logging_follows_the_current_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """Logging configured by a command must not pin the stderr object current at that time.

    Regression: ``PrintLoggerFactory(sys.stderr)`` kept a captured stream that was closed after the test,
    and every later structlog call (e.g. in the SystemOne request validator) raised "I/O operation on
    closed file", which turned valid requests into schema violations.
    """
    import io

    import structlog

    structlog.reset_defaults()
    try:
        first = io.StringIO()
        monkeypatch.setattr(sys, "stderr", first)
        cli._configure_default_logging()
        assert structlog.is_configured()
        structlog.get_logger("t").info("first_line")
        assert "first_line" in first.getvalue()
        first.close()

        second = io.StringIO()
        monkeypatch.setattr(sys, "stderr", second)
        structlog.get_logger("t").info("second_line")
        assert "second_line" in second.getvalue()
    finally:
        structlog.reset_defaults()


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("clef-router ")


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_option_has_help_text() -> None:
    missing = [
        f"{' '.join(path) or 'clef-router'} {action.dest}"
        for path, parser in _parsers(cli.build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not (action.help or "").strip()
    ]
    assert missing == []


def test_run_help_lists_the_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "CLEF_KAFKA__BOOTSTRAP_SERVERS" in out
    assert "CLEF_ENGINE__DEVICE" in out


def test_group_command_errors_name_the_whole_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["dlq", "replay", "--reason", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clef-router dlq replay: error:")
    assert "bad_json" in err
    assert "schema_violation" in err
    assert err.count("\n") == 1


def test_run_with_a_missing_release_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CLEF_ENGINE__MODEL_PATH", str(tmp_path / "nothing-here"))
    assert cli.main(["run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "nothing-here is not a directory" in err


def test_run_on_cuda_without_a_gpu_says_to_use_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CLEF_ENGINE__MODEL_PATH", str(tmp_path))
    monkeypatch.setenv("CLEF_ENGINE__DEVICE", "cuda")
    assert cli.main(["run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "set CLEF_ENGINE__DEVICE=cpu" in err


def test_run_with_sm90_kernels_that_cannot_run_exits_2_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    import engine.device

    monkeypatch.setattr(engine.device, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    monkeypatch.setenv("CLEF_ENGINE__MODEL_PATH", str(tmp_path))  # no release: loading would fail later
    monkeypatch.setenv("CLEF_ENGINE__DEVICE", "cuda")
    monkeypatch.setenv("CLEF_ENGINE__FP8_TEXT_ONLY", "true")
    monkeypatch.setenv("CLEF_ENGINE__SM90_EXPERTS", "true")
    assert cli.main(["run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "CLEF_ENGINE__SM90_EXPERTS=true, but the sm90 expert kernels need a Hopper GPU" in err
    assert "NVIDIA A100 (sm_80)" in err


def test_kafka_errors_name_their_type_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiokafka.errors import KafkaConnectionError

    def register(commands: Commands) -> None:
        def fail(args: argparse.Namespace) -> int:
            raise KafkaConnectionError("Unable to bootstrap from x")

        commands.add_parser("kfail", help="fails like aiokafka").set_defaults(func=fail)

    fake = types.ModuleType("consumer.commands._kafkafail")
    fake.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("_kafkafail",))
    assert cli.main(["kfail"]) == 1
    err = capsys.readouterr().err
    assert err == "clef-router kfail: error: KafkaConnectionError: Unable to bootstrap from x\n"


def test_torchvision_notice_is_silenced(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    cli._configure_default_logging()
    log = logging.getLogger("engine.model.release")
    with caplog.at_level(logging.WARNING, logger="engine.model.release"):
        log.warning(
            "processor not loaded from /x: Qwen2VLVideoProcessor requires the Torchvision library but"
        )
        log.warning("another warning")
    assert [r.getMessage() for r in caplog.records] == ["another warning"]


def test_kafka_local_refuses_a_taken_port_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        assert cli.main(["kafka-local", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"port {port} on 127.0.0.1 is in use" in err
    assert "--port 0" in err


def test_kafka_local_defaults_to_the_clients_default_port() -> None:
    from consumer.settings import KafkaSettings

    parser = cli.build_parser()
    args = parser.parse_args(["kafka-local"])
    assert KafkaSettings().bootstrap_servers == f"127.0.0.1:{args.port}"
