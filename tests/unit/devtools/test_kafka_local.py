"""Pure parts of the Kafka harness: jar cache rules, cluster ids, ports (no JVM started here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devtools import kafka_jars
from devtools.kafka_local import HOST, free_port, new_cluster_id


def test_cluster_id_is_kraft_format() -> None:
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for cid in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cid)
        assert not cid.startswith("-")


def test_free_port_is_bindable_on_loopback() -> None:
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind((HOST, port))


def test_cache_hit_needs_no_maven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", "")  # no mvn: a cache hit must not need it
    folder = tmp_path / "kafka-9.9.9"
    folder.mkdir()
    (folder / "kafka_2.13-9.9.9.jar").write_bytes(b"jar")
    assert not kafka_jars.is_fetched("9.9.9")  # no COMPLETE marker: a half-finished fetch
    with pytest.raises(kafka_jars.KafkaFetchError, match="mvn"):
        kafka_jars.ensure_kafka_jars("9.9.9")
    (folder / "COMPLETE").write_text("kafka 9.9.9\n")
    assert kafka_jars.ensure_kafka_jars("9.9.9") == folder


def test_pom_pins_broker_and_logging() -> None:
    pom = kafka_jars._pom("4.4.0", "2.25.5")
    assert "<artifactId>kafka_2.13</artifactId><version>4.4.0</version>" in pom
    for artifact in ("log4j-api", "log4j-core", "log4j-slf4j-impl"):
        assert f"<artifactId>{artifact}</artifactId><version>2.25.5</version>" in pom


def test_tools_flavour_adds_kafka_tools_and_has_its_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools_pom = kafka_jars._pom("4.4.0", "2.25.5", True)
    assert "<artifactId>kafka-tools</artifactId><version>4.4.0</version>" in tools_pom
    assert "kafka-tools" not in kafka_jars._pom("4.4.0", "2.25.5")
    monkeypatch.setenv("CLEF_CACHE_DIR", str(tmp_path))
    folder = kafka_jars.jar_dir("9.9.9", tools=True)
    assert folder == tmp_path / "kafka-9.9.9-tools"
    folder.mkdir()
    (folder / "kafka_2.13-9.9.9.jar").write_bytes(b"jar")
    (folder / "COMPLETE").write_text("kafka 9.9.9\n")
    assert not kafka_jars.is_fetched("9.9.9", tools=True)  # the tools jar is missing
    (folder / "kafka-tools-9.9.9.jar").write_bytes(b"jar")
    assert kafka_jars.is_fetched("9.9.9", tools=True)
    assert not kafka_jars.is_fetched("9.9.9")  # the plain folder is another one


def test_extra_listeners_properties_and_format_args_reach_the_config(tmp_path: Path) -> None:
    from devtools.kafka_local import ExtraListener, LocalKafka

    broker = LocalKafka(
        extra_listeners=[ExtraListener("PROXIED", "PLAINTEXT", 4001, advertised_port=5001)],
        extra_properties={"super.users": "User:ANONYMOUS", "num.io.threads": "3"},
        format_args=["--add-scram", "SCRAM-SHA-256=[name=a,password=b]"],
    )
    broker._run_dir, broker._port, broker._controller_port = tmp_path, 4000, 4002
    broker._write_config()
    props = dict(
        line.split("=", 1) for line in (tmp_path / "server.properties").read_text().splitlines() if line
    )
    assert (
        props["listeners"]
        == "PLAINTEXT://127.0.0.1:4000,CONTROLLER://127.0.0.1:4002,PROXIED://127.0.0.1:4001"
    )
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:4000,PROXIED://127.0.0.1:5001"
    assert props["listener.security.protocol.map"].endswith(",PROXIED:PLAINTEXT")
    assert props["super.users"] == "User:ANONYMOUS"
    assert props["num.io.threads"] == "3"  # extra properties override the defaults
    assert broker._format_args[-1] == "SCRAM-SHA-256=[name=a,password=b]"
