"""`bench.stage_probe` on CPU with stand-ins for `Engine.run` and `to_host`: an inner call is timed inside
its outer call only, and a run's `launch` is the run less its `to_host` calls, in wall and CPU time."""

from __future__ import annotations

import time

import pytest

from bench import stage_probe


def _spin(seconds: float) -> None:
    """Run Python until this thread has had `seconds` of CPU (however loaded the machine)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_runs_launch_is_the_run_less_its_wait_for_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in stage_probe._samples}
    monkeypatch.setattr(stage_probe, "_samples", samples)
    monkeypatch.setattr(stage_probe, "_runs", [])
    monkeypatch.setattr(stage_probe, "_gc", [])
    to_host = stage_probe._timed("to_host", lambda: time.sleep(0.03))  # waits: wall, no CPU

    def run() -> None:
        _spin(0.02)  # launching: CPU
        to_host()

    timed_run = stage_probe._timed("run", run)
    to_host()  # outside a run: not timed
    timed_run()
    timed_run()
    assert len(samples["to_host"]) == len(samples["run"]) == len(samples["launch"]) == 2
    for (run_wall, run_cpu), (wait_wall, _), (launch_wall, launch_cpu) in zip(
        samples["run"], samples["to_host"], samples["launch"], strict=True
    ):
        assert launch_wall == pytest.approx(run_wall - wait_wall)
        assert launch_wall >= 0.02
        assert wait_wall >= 0.03
        assert launch_cpu >= 0.02  # the spin's CPU stays with the launch
        assert run_cpu - launch_cpu < 0.005  # the sleep took none
    summary = stage_probe.summary()
    assert summary["launch"]["calls"] == 2
    assert set(summary) == {"run", "to_host", "launch", "runs_no_gc"}  # no collector pass was recorded
    assert summary["runs_no_gc"]["calls"] == 2
    assert summary["runs_no_gc"]["ms_mean"] >= 50.0
    stage_probe._gc.append((0.0, 0.02, 2))
    stage_probe.reset()  # bench.e2e, before the Kafka phase
    assert not any(samples.values())
    assert not stage_probe._runs
    assert not stage_probe._gc
    timed_run()
    assert stage_probe.summary()["runs_no_gc"]["calls"] == 1


def test_the_runs_a_collector_pass_overlapped_are_told_apart() -> None:
    runs = [(0.0, 0.010), (0.020, 0.030), (0.040, 0.070)]
    passes = [
        (0.005, 0.0065, 2),  # 1.5 ms inside the first run
        (0.031, 0.0395, 1),  # 8.5 ms between the second and the third: meets neither
        (0.069, 0.0692, 0),  # 0.2 ms at the third's end: too short to count
    ]
    out = stage_probe.gc_summary(runs, passes)
    assert out["gc_gen2"]["calls"] == 1
    assert out["gc_gen2"]["ms_max"] == pytest.approx(1.5)
    assert out["gc_gen1"]["ms_total"] == pytest.approx(8.5)
    assert out["gc_gen0"]["ms_p50"] == pytest.approx(0.2)
    assert out["runs_met_gc"]["calls"] == 1
    assert out["runs_met_gc"]["ms_max"] == pytest.approx(10.0)
    assert out["runs_no_gc"]["calls"] == 2
    assert out["runs_no_gc"]["ms_mean"] == pytest.approx(20.0)
    assert "gc_long" not in out  # no pass of 10 ms or more
    late = stage_probe.gc_summary(runs, [*passes, (0.1, 0.125, 2), (-1.0, -0.9, 2)])
    assert late["gc_long"] == {"s0.100_gen2": pytest.approx(25.0), "s-1.000_gen2": pytest.approx(100.0)}


def test_install_times_the_collectors_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    monkeypatch.setattr(stage_probe, "_gc", [])
    gc.callbacks.append(stage_probe._on_gc)  # what install adds, without wrapping the engine
    try:
        gc.collect(1)
    finally:
        gc.callbacks.remove(stage_probe._on_gc)
    assert [g for _, _, g in stage_probe._gc] == [1]
    start, end, _ = stage_probe._gc[0]
    assert end >= start


def test_the_gil_summary_splits_runs_by_the_stalls_that_overlapped_them() -> None:
    runs = [(10.0, 10.05), (11.0, 11.02), (12.0, 12.1)]  # 50, 20, 100 ms
    lags = [(10.01, 0.002), (10.02, 0.012), (11.5, 0.03), (12.09, 0.006)]  # due, lag (s)
    out = stage_probe.gil_summary(runs, lags, wakes=500)
    assert out["gil_lag"] == {
        "wakes": 500,
        "late_1ms": 4,
        "late_5ms": 3,
        "late_10ms": 2,
        "ms_max": 30.0,
        "stall_ms_total": 48.0,
    }
    assert (
        out["runs_met_gil"]["calls"] == 2
    )  # the first (a 12 ms lag inside) and the third (6 ms, at its end)
    assert out["runs_met_gil"]["ms_max"] == pytest.approx(100.0)
    assert out["runs_no_gil"]["calls"] == 1  # the 30 ms stall fell between runs
    assert out["gil_long"] == {"s0.020": 12.0, "s1.500": 30.0}
    assert stage_probe.gil_summary(runs, [], wakes=0) == {}


def test_the_gil_sampler_sees_a_call_that_keeps_the_gil(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sum` over a range runs in C without letting the GIL go: the sampler's wake-up during it runs late by
    about as long as the call (a lower bound that holds however loaded the machine)."""
    import threading

    monkeypatch.setattr(stage_probe, "_lags", [])
    monkeypatch.setattr(stage_probe, "_wakes", [0])
    stop = threading.Event()
    thread = stage_probe.start_gil_sampler(0.001, stop=stop)
    try:
        deadline = time.monotonic() + 5.0
        while stage_probe._wakes[0] < 5 and time.monotonic() < deadline:
            time.sleep(0.005)
        began = time.perf_counter()
        sum(range(8_000_000))  # holds the GIL (about 100 ms here)
        held = time.perf_counter() - began
        time.sleep(0.02)  # the sampler's late wake-up runs and records
    finally:
        stop.set()
        thread.join(timeout=5.0)
    assert not thread.is_alive()
    assert held >= 0.02, f"the call held the GIL {held * 1000:.1f} ms: too short to tell"
    assert max(lag for _, lag in stage_probe._lags) >= 0.5 * held
    with pytest.raises(ValueError, match="positive"):
        stage_probe.start_gil_sampler(0.0)
