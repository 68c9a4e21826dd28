"""Fixtures for integration tests against a real Apache Kafka 4.x broker (single-node KRaft on 127.0.0.1).

- ``kafka_broker`` (session): one broker for the whole session. Its version and start-to-ready time are
  written to the terminal at once (even under output capture) and again in the terminal summary.
- ``new_topic`` (function): ``new_topic(prefix="t", partitions=1, config=None) -> str`` creates a topic
  with a unique name on the session broker and returns the name.
- ``restartable_broker`` (function): a broker of the test's own; ``restart()`` / ``restart(hard=True)``
  keep its ports and data. Blocking: from async tests use ``await asyncio.to_thread(broker.restart)``.

Every test under ``tests/integration`` is marked ``kafka``. Fixtures are synchronous and the broker object
holds no event loop, so tests may use them from any event loop.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.kafka_local import LocalKafka

NewTopic = Callable[..., str]
_HERE = Path(__file__).parent
_REPORT_KEY = pytest.StashKey[list[str]]()


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selection runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test in this folder ``kafka``."""
    for item in items:
        if _HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.kafka)


def _report(config: pytest.Config, line: str) -> None:
    """Write ``line`` to the real terminal now, bypassing capture, and keep it for the summary."""
    config.stash.setdefault(_REPORT_KEY, []).append(line)
    capture = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if capture is None or reporter is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line(line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Repeat the broker lines in the summary so CI logs always show the broker version."""
    lines = config.stash.get(_REPORT_KEY, [])
    if lines:
        terminalreporter.section("kafka broker")
        for line in lines:
            terminalreporter.write_line(line)


def _describe(broker: LocalKafka, what: str) -> str:
    ready = broker.ready_seconds if broker.ready_seconds is not None else float("nan")
    return (
        f"{what}: Apache Kafka {broker.broker_version} (KRaft) at {broker.bootstrap_servers}, "
        f"start-to-ready {ready:.2f} s"
    )


@pytest.fixture(scope="session")
def kafka_broker(pytestconfig: pytest.Config) -> Iterator[LocalKafka]:
    """The session's broker (started on first use, stopped and deleted at session end)."""
    broker = LocalKafka()
    broker.start()
    _report(pytestconfig, _describe(broker, "kafka broker"))
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def new_topic(kafka_broker: LocalKafka, request: pytest.FixtureRequest) -> NewTopic:
    """Factory creating uniquely named topics on the session broker."""
    stem = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")[:60] or "test"

    def create(prefix: str = "t", partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"{prefix}.{stem}.{uuid.uuid4().hex[:8]}"
        kafka_broker.create_topics([name], partitions=partitions, config=config)
        return name

    return create


@pytest.fixture
def restartable_broker(pytestconfig: pytest.Config) -> Iterator[LocalKafka]:
    """A broker owned by one test; ``restart()`` keeps ports and data; removed after the test."""
    broker = LocalKafka()
    broker.start()
    _report(pytestconfig, _describe(broker, "restartable broker"))
    try:
        yield broker
    finally:
        broker.stop()
