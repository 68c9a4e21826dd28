"""`clef-router decide` and `clef-router make-tiny-release`, run in-process through `consumer.cli.main`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from consumer.cli import main

GOOD = {
    "model": "cli-test",
    "state": {"alert": "disk full", "host": "db-01"},
    "questions": {
        "department": {"type": "choice", "criteria": {"storage": "Disks", "network": None}},
        "urgency": {"type": "score", "criteria": ["low", "high"]},
        "outage": {"type": "noul"},
    },
}


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().out


def test_decide_one_request(tiny_release: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(GOOD), encoding="utf-8")
    code, out = run(["decide", str(path), "--model", str(tiny_release), "--device", "cpu"], capsys)
    assert code == 0
    body = json.loads(out)
    assert body["model"] == "cli-test"
    assert list(body["answers"]) == ["department", "urgency", "outage"]
    assert set(body["answers"]["department"]["probabilities"]) == {"storage", "network"}
    assert body["usage"]["output_tokens"] == 0
    assert body["usage"]["input_tokens"] > 0


@pytest.mark.parametrize(
    ("content", "shape"),
    [
        ("{broken", dict),  # 400 bad_json: {"detail": {"error_type", "message"}}
        (json.dumps({"state": "x", "questions": {}}), list),  # 422: {"detail": [{"type", "loc", "msg"}]}
    ],
)
def test_decide_invalid_request_prints_error_body_and_exits_2(
    tiny_release: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, shape: type
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    code = main(["decide", str(path), "--model", str(tiny_release), "--device", "cpu"])
    assert code == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # the error body goes to stderr, before the model is loaded
    detail: Any = json.loads(captured.err)["detail"]
    if shape is dict:
        assert isinstance(detail, dict)
        assert detail["error_type"] == "bad_json"
    else:
        assert isinstance(detail, list)
        assert {"type", "loc", "msg"} <= set(detail[0])


def test_decide_batch_answers_every_line_in_order(
    tiny_release: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        json.dumps(GOOD),
        "[1, 2]",
        "",  # blank lines are skipped
        json.dumps({**GOOD, "model": "second", "state": "short"}),
        json.dumps({"state": "x", "questions": {"q": {"type": "score", "criteria": {"a": 1}}}}),
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["decide", "--batch", str(path), "--model", str(tiny_release), "--device", "cpu"]
    argv += ["--dtype", "float32"]
    code, out = run(argv, capsys)
    assert code == 2  # at least one invalid line
    results = [json.loads(line) for line in out.splitlines()]
    assert len(results) == 4
    assert results[0]["model"] == "cli-test"
    assert results[1]["detail"]["error_type"] == "not_an_object"
    assert results[2]["model"] == "second"
    assert isinstance(results[3]["detail"], list)

    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n", encoding="utf-8")
    code, out = run(argv, capsys)
    assert code == 0
    first, second = (json.loads(line) for line in out.splitlines())
    assert first == second


def test_decide_needs_exactly_one_input(tiny_release: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["decide", "--model", str(tiny_release), "--device", "cpu"]) == 2
    assert "exactly one" in capsys.readouterr().err


def test_make_tiny_release(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "release"
    code, out = run(["make-tiny-release", str(target), "--seed", "3"], capsys)
    assert code == 0
    assert out.strip() == str(target)
    for name in ("config.json", "model.safetensors.index.json", "joint_head.safetensors", "tokenizer.json"):
        assert (target / name).is_file()


def test_decide_batch_one_engine_failure_is_its_line_and_exit_1(
    tiny_release: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.runner

    real_launch = engine.runner.launch_forward

    def launch_forward(model: Any, batch: Any, between: Any = None) -> Any:
        if any("boom" in qids for qids in batch.question_ids):
            raise RuntimeError("thinker failure")  # any error inside the model, not only OOM
        return real_launch(model, batch, between)

    monkeypatch.setattr(engine.runner, "launch_forward", launch_forward)
    boom = {**GOOD, "questions": {"boom": {"type": "noul"}}}
    lines = [json.dumps(GOOD), json.dumps(boom), "{broken", json.dumps({**GOOD, "model": "third"})]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["decide", "--batch", str(path), "--model", str(tiny_release), "--device", "cpu"]
    code, out = run(argv, capsys)
    assert code == 1  # an engine failure outranks the invalid line's 2
    results = [json.loads(line) for line in out.splitlines()]
    assert len(results) == 4
    assert results[0]["model"] == "cli-test"
    assert results[1]["detail"]["error_type"] == "engine_failed"
    assert results[2]["detail"]["error_type"] == "bad_json"
    assert results[3]["model"] == "third"


def test_decide_invalid_lines_are_answered_before_any_model_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.runner import Engine

    def no_load(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model must not load when no line is valid")

    monkeypatch.setattr(Engine, "from_release", no_load)
    path = tmp_path / "requests.jsonl"
    path.write_text("{broken\n[1]\n", encoding="utf-8")
    argv = ["decide", "--batch", str(path), "--model", str(tmp_path / "absent"), "--device", "cpu"]
    code, out = run(argv, capsys)
    assert code == 2
    assert [json.loads(line)["detail"]["error_type"] for line in out.splitlines()] == [
        "bad_json",
        "not_an_object",
    ]


def test_decide_unreadable_input_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["decide", "--batch", str(tmp_path / "missing.jsonl"), "--model", str(tmp_path), "--device", "cpu"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "missing.jsonl" in captured.err
