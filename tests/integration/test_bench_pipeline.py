"""`python -m bench pipeline` runs end to end on a real broker (a tiny run: this checks that the three
loops finish and report, not their speed)."""

from __future__ import annotations

import pytest

from bench.pipeline import KINDS, main
from devtools.kafka_local import LocalKafka

pytestmark = pytest.mark.kafka


def test_bench_pipeline_small_run(kafka_broker: LocalKafka, capsys: pytest.CaptureFixture[str]) -> None:
    summary = main(events=300, repeats=1, bootstrap=kafka_broker.bootstrap_servers)
    for kind in KINDS:
        assert summary[f"{kind}_eps_median"] > 0
        assert summary[f"{kind}_cpu_us_per_event_median"] > 0
    assert summary["ratio"] == round(summary["service_eps_median"] / summary["plain_eps_median"], 3)
    out = capsys.readouterr().out
    assert '"repeat": 1' in out
    assert "| ratio service / plain" in out


def test_bench_pipeline_one_kind_with_settings(kafka_broker: LocalKafka) -> None:
    summary = main(
        events=200,
        repeats=1,
        bootstrap=kafka_broker.bootstrap_servers,
        kinds=("service",),
        service_settings={"batching": {"max_batch_records": 8}},
    )
    assert summary["service_eps_median"] > 0
    assert "plain_eps_median" not in summary
    assert "ratio" not in summary
    assert summary["service_settings"]["batching"] == {"max_batch_records": 8}
    assert summary["service_settings"]["kafka"] == {"commit_interval_ms": 50}
