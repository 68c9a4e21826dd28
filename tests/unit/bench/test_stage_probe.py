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
    assert set(summary) == {"run", "to_host", "launch"}
