"""Settings: env nesting, TOML, unknown keys rejected, secrets masked, frozen sub-configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from consumer.settings import Settings, SettingsError, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("CLEF_"):
            monkeypatch.delenv(name)


def test_defaults_follow_the_spec() -> None:
    s = load_settings()
    assert s.topics.input == ("alerts.in",)
    assert (s.topics.decisions, s.topics.review, s.topics.unrouted, s.topics.dlq) == (
        "decisions",
        "route.review",
        "route.unrouted",
        "alerts.dlq",
    )
    assert s.topics.route_prefix == "route."
    assert s.kafka.create_topics is True
    assert s.routing.department_map["network"] == "network"


def test_env_nesting_with_double_underscore(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEF_KAFKA__BOOTSTRAP_SERVERS", "broker:19092")
    monkeypatch.setenv("CLEF_KAFKA__GROUP_ID", "g7")
    monkeypatch.setenv("CLEF_ENGINE__MODEL_PATH", "/models/clef")
    monkeypatch.setenv("CLEF_ENGINE__DEVICE", "cpu")
    monkeypatch.setenv("CLEF_HTTP__PORT", "9000")
    monkeypatch.setenv("CLEF_TOPICS__INPUT", '["a.in", "b.in"]')
    monkeypatch.setenv("CLEF_KAFKA__CREATE_TOPICS", "false")
    s = load_settings()
    assert s.kafka.bootstrap_servers == "broker:19092"
    assert s.kafka.group_id == "g7"
    assert s.engine.model_path == Path("/models/clef")
    assert s.engine.device == "cpu"
    assert s.http.port == 9000
    assert s.topics.input == ("a.in", "b.in")
    assert s.kafka.create_topics is False


def test_unknown_env_key_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEF_KAFKA__BOOTSTRAP_SERVER", "typo:1")
    with pytest.raises(SettingsError, match="CLEF_KAFKA__BOOTSTRAP_SERVER"):
        load_settings()


def test_unknown_top_level_env_key_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEF_NOPE", "1")
    with pytest.raises(SettingsError):
        load_settings()


def test_toml_file_and_env_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "clef.toml"
    cfg.write_text(
        '[kafka]\nbootstrap_servers = "file:1"\ngroup_id = "from-file"\n[batching]\nmax_batch_records = 7\n'
    )
    monkeypatch.setenv("CLEF_KAFKA__GROUP_ID", "from-env")
    s = load_settings(cfg)
    assert s.kafka.bootstrap_servers == "file:1"
    assert s.kafka.group_id == "from-env"
    assert s.batching.max_batch_records == 7


def test_unknown_toml_key_is_rejected(tmp_path: Path) -> None:
    cfg = tmp_path / "clef.toml"
    cfg.write_text("[kafka]\nbootstrap = 'x'\n")
    with pytest.raises(SettingsError):
        load_settings(cfg)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="not found"):
        load_settings(tmp_path / "missing.toml")


def test_secrets_are_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEF_KAFKA__SECURITY__SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("CLEF_HTTP__API_KEYS", '["k-secret"]')
    s = load_settings()
    dumped = repr(s.masked())
    assert "hunter2" not in dumped
    assert "k-secret" not in dumped
    assert s.masked()["kafka"]["security"]["sasl_password"] == "**********"
    assert s.kafka.security.sasl_password is not None
    assert s.kafka.security.sasl_password.get_secret_value() == "hunter2"


def test_sub_configs_are_frozen() -> None:
    s = load_settings()
    with pytest.raises(ValidationError):
        s.kafka.group_id = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        Settings(kafka={"max_in_flight": 0})


def test_device_index_picks_one_gpu_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from consumer.settings import engine_device

    assert engine_device(load_settings().engine) == "cuda"
    monkeypatch.setenv("CLEF_ENGINE__DEVICE_INDEX", "3")
    assert engine_device(load_settings().engine) == "cuda:3"
    monkeypatch.setenv("CLEF_ENGINE__DEVICE", "cuda:1")
    with pytest.raises(SettingsError, match="already names a device"):
        engine_device(load_settings().engine)
    monkeypatch.setenv("CLEF_ENGINE__DEVICE_INDEX", "-1")
    with pytest.raises(SettingsError):
        load_settings()


@pytest.mark.parametrize("name", ["CLEF_CACHE_DIR", "CLEF_VENV", "CLEF_DEBUG", "CLEF_MODEL_DIR"])
def test_script_variables_are_not_settings_errors(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README tells users to export these for the scripts; the service must start with them set."""
    monkeypatch.setenv(name, "/somewhere")
    monkeypatch.setenv("CLEF_LOG_LEVL", "debug")  # a typo next to them is still caught
    with pytest.raises(SettingsError, match="CLEF_LOG_LEVL"):
        load_settings()
    monkeypatch.delenv("CLEF_LOG_LEVL")
    assert load_settings().log_level == "info"


def test_the_engines_gpu_switches_reach_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from consumer.engine_config import engine_config

    switches = ("fp8_experts", "fp8_text_only", "fp8_attention", "sm90_experts", "lane_stream")
    s = load_settings()
    config = engine_config(s.engine, s.batching)
    assert [getattr(config, name) for name in switches] == [False] * len(switches)
    for name in switches:
        monkeypatch.setenv(f"CLEF_ENGINE__{name.upper()}", "true")
    s = load_settings()
    config = engine_config(s.engine, s.batching)
    assert [getattr(config, name) for name in switches] == [True] * len(switches)
