"""deploy/k8s validated offline: built-in kinds against the Kubernetes schemas `kubernetes-validate` ships
(strict: unknown fields fail), the KEDA ScaledObject against the schema vendored in deploy/k8s/schemas, and
the settings the manifests share agree (group, topic, target name, probes, one GPU per pod)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from consumer.settings import Settings

K8S = Path(__file__).resolve().parents[3] / "deploy" / "k8s"
KUBERNETES_VERSION = "1.37.0"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def _deployment() -> dict[str, Any]:
    (doc,) = _docs("deployment.yaml")
    return doc


def _scaled() -> dict[str, Any]:
    (doc,) = _docs("scaledobject.yaml")
    return doc


def _env(deployment: dict[str, Any]) -> dict[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def test_deployment_is_valid_kubernetes() -> None:
    kubernetes_validate.validate(_deployment(), KUBERNETES_VERSION, strict=True)


def test_the_validator_rejects_a_misspelt_field() -> None:
    broken = _deployment()
    broken["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_scaled_object_matches_the_vendored_keda_schema() -> None:
    schema = json.loads((K8S / "schemas" / "keda-scaledobject-v1alpha1.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(_scaled(), schema, cls=jsonschema.Draft202012Validator)
    broken = _scaled()
    broken["spec"]["triggers"][0]["metadata"]["lagTreshold"] = "10"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema, cls=jsonschema.Draft202012Validator)


def test_one_gpu_per_pod_and_probes_on_health_and_readiness() -> None:
    pod = _deployment()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    port = int(_env(_deployment())["CLEF_HTTP__PORT"])
    assert container["ports"][0]["containerPort"] == port
    assert pod["terminationGracePeriodSeconds"] > Settings().kafka.shutdown_timeout_s


def test_manifests_agree_with_each_other_and_with_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    deployment, scaled = _deployment(), _scaled()
    env = _env(deployment)
    for name, value in env.items():  # every variable names a real setting with a valid value
        monkeypatch.setenv(name, value)
    from consumer.settings import load_settings

    settings = load_settings()
    (trigger,) = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert meta["consumerGroup"] == settings.kafka.group_id
    assert meta["bootstrapServers"] == settings.kafka.bootstrap_servers
    assert (meta["topic"],) == settings.topics.input
    assert settings.engine.device_index == 0
    assert settings.http.host == "0.0.0.0"
