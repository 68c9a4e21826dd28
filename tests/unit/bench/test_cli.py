"""`python -m bench` (`bench.cli`) and its alias `clef-router bench`: every command has --help under both
program names, bad option values are usage errors, and the product CLI never imports `bench`/`devtools`."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import cli as bench_cli
from consumer import cli

ROOT = Path(__file__).resolve().parents[3]
COMMANDS = ("engine", "pipeline", "http", "load", "startup")


def _command_names() -> list[str]:
    parser = bench_cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(sub.choices)


def test_python_m_bench_help_lists_the_commands() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m bench")
    listed = [m.group(1) for m in re.finditer(r"^    (\S+)", done.stdout, re.MULTILINE)]  # 4 spaces: a name
    assert listed == list(COMMANDS)
    assert _command_names() == list(COMMANDS)


def test_python_m_bench_without_a_command_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "required" in done.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_help_under_both_names(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench_cli.run([command, "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m bench {command} ")
    assert cli.main(["bench", command, "--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: clef-router bench {command} ")


def test_alias_help_is_bench_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: clef-router bench [-h] COMMAND")
    assert all(f"    {c} " in out for c in COMMANDS)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["http", "--concurrency", "0"], "--concurrency takes positive integers"),
        (["http", "--seconds", "0"], "--seconds must be > 0"),
        (["pipeline", "--events", "10"], "--events must be >= 100"),
        (["pipeline", "--set", "batching.max_batch_records=x"], "max_batch_records"),
    ],
)
def test_bad_values_are_usage_errors_before_anything_starts(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clef-router bench: error:")
    assert needle in err
    assert err.count("\n") == 1, err


def test_parse_sets_reads_json_values_and_strings() -> None:
    sets = ["batching.max_batch_records=32", "batching.mode=adaptive", "kafka.group_id=g1"]
    assert bench_cli.parse_sets(sets) == {
        "batching": {"max_batch_records": 32, "mode": "adaptive"},
        "kafka": {"group_id": "g1"},
    }


def test_the_product_cli_imports_neither_bench_nor_devtools() -> None:
    """Importing `consumer.cli` and building its whole parser (every command module registered, the bench
    alias included) loads no module of `bench` or `devtools`."""
    probe = (
        "import sys; import consumer.cli as c; c.build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('bench', 'devtools')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    # the probe itself can see bench: it is not passing for want of the package
    seen = subprocess.run(
        [sys.executable, "-c", "import bench.cli, sys; print('bench' in sys.modules)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert seen.stdout.strip() == "True", seen.stderr
