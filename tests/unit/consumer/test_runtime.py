"""`consumer.runtime.set_switch_interval`: the GIL switch interval the service sets at start, from its
setting (Python's 5 ms by default; a shorter one is an operator's choice, BENCHMARKS.md), and
`tune_process`, which applies it with the collector's settings."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

from consumer.runtime import set_switch_interval, tune_process
from consumer.settings import SettingsError, load_settings


@pytest.fixture(autouse=True)
def _keep_interval() -> Iterator[None]:
    """The interval is process-wide: each test leaves it as it found it."""
    before = sys.getswitchinterval()
    thresholds = gc.get_threshold()
    yield
    sys.setswitchinterval(before)
    gc.set_threshold(*thresholds)


def test_the_setting_becomes_the_processs_interval() -> None:
    set_switch_interval(0.5)
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    set_switch_interval(load_settings().gil_switch_interval_ms)
    assert sys.getswitchinterval() == pytest.approx(0.005)  # the default is Python's own


@pytest.mark.parametrize("ms", [0.0, -1.0, float("nan")])
def test_a_switch_interval_that_is_not_positive_is_refused(ms: float) -> None:
    before = sys.getswitchinterval()
    with pytest.raises(ValueError, match="must be positive"):
        set_switch_interval(ms)
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize("value", ["0", "-2", "101"])
def test_the_setting_is_bounded(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEF_GIL_SWITCH_INTERVAL_MS", value)
    with pytest.raises(SettingsError, match="gil_switch_interval_ms"):
        load_settings()


def test_tune_process_applies_the_collectors_and_the_switch_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEF_GIL_SWITCH_INTERVAL_MS", "0.5")
    monkeypatch.setenv("CLEF_GC_GEN0_THRESHOLD", "12345")
    monkeypatch.setenv("CLEF_GC_FREEZE", "false")  # no gc.freeze() of the test process
    tune_process(load_settings())
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    assert gc.get_threshold()[0] == 12345
