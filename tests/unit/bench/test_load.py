"""`bench.load` on a fake staged engine (a GPU that sleeps per token): the figures it reports are complete and
consistent, and `main` writes the JSON lines and the plot. Speeds are not asserted (benchmarks do that)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import pytest

import bench.load
from bench.load_run import FIXED_DEFAULT, LoadRunner, capacity, quantiles, single_latency
from engine.types import Between, RunsWhenLaunched


@dataclass(frozen=True)
class Prep:
    num_tokens: int


@dataclass(frozen=True)
class Staged:
    prepared: list[Prep]


class SleepyEngine(RunsWhenLaunched[Staged, Staged]):
    """prepare: a request is its token count; run sleeps 1 ms + 1 us per token (the GPU thread)."""

    def __init__(self) -> None:
        self.runs = 0

    def prepare(self, request: int) -> Prep:
        return Prep(request)

    def execute(self, batch: Sequence[Prep]) -> list[str]:
        return self.respond(self.run(self.stage(batch)))

    def stage(self, batch: Sequence[Prep]) -> Staged:
        return Staged(list(batch))

    def run(self, staged: Staged, between: Between | None = None) -> Staged:
        self.runs += 1
        time.sleep(0.001 + 1e-6 * sum(p.num_tokens for p in staged.prepared))
        return staged

    def respond(self, staged: Staged) -> list[str]:
        return [f"answer:{p.num_tokens}" for p in staged.prepared]

    def lane(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()


POOL = [200, 500, 800, 1200, 1500]


def test_quantiles_nearest_rank_in_ms() -> None:
    q = quantiles([i / 1000 for i in range(1, 101)])
    assert q == {"p50_ms": 51.0, "p95_ms": 96.0, "p99_ms": 100.0, "max_ms": 100.0}
    assert quantiles([])["p99_ms"] == 0.0


def test_capacity_counts_every_event_and_batch() -> None:
    engine = SleepyEngine()
    r = asyncio.run(capacity(engine, POOL * 20, {**FIXED_DEFAULT, "max_batch_tokens": 4000}))
    assert r["events"] == 100
    assert r["batches"] == engine.runs
    assert r["records_per_batch_max"] <= 5  # 4,000-token budget: at most 5 of these events
    assert r["tokens_per_batch_mean"] <= 4000
    assert 0 < r["gpu_busy"] <= 1


def test_single_latency_reports_both_paths() -> None:
    r = single_latency(SleepyEngine(), POOL, 5)
    assert r["count"] == 5
    assert 0 < r["direct_p50_ms"] <= r["direct_p99_ms"]
    assert 0 < r["batcher_p50_ms"] <= r["batcher_p99_ms"]


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_open_loop_answers_every_event_and_reports_the_figures(mode: str) -> None:
    engine = SleepyEngine()

    async def go() -> dict[str, float]:
        runner = LoadRunner(engine, {**FIXED_DEFAULT, "mode": mode}, POOL, seed=3)
        await runner.start()
        r = await runner.open_loop(100.0, 0.6)
        await runner.close()
        return r

    r = asyncio.run(go())
    assert r["events"] > 10
    assert r["events_in_s"] == pytest.approx(r["events"] / 0.6, abs=0.01)
    assert r["unanswered"] == 0
    assert r["failed"] == 0
    assert r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] <= r["max_ms"]
    assert r["batches"] == engine.runs
    assert 0 < r["gpu_busy_metric"] <= 1
    assert 0 < r["batch_fill_mean"] <= 1


def test_main_writes_json_lines_and_the_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.load, "build", lambda cpu, max_tokens, routing: SleepyEngine())
    monkeypatch.setattr(bench.load, "make_pool", lambda engine, rng, size: POOL)
    args = ["--cpu", "--out", str(tmp_path), "--seconds", "0.4", "--loads", "0.5,1.1"]
    args += ["--budgets", "2000,4000", "--adaptive-max", "4000", "--backlog", "40", "--singles", "3"]
    assert bench.load.main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "load.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in rows]
    assert kinds == ["info", "single", "capacity", "capacity", "capacity"] + ["load"] * 4 + ["done"]
    adaptive_cap = rows[4]
    assert adaptive_cap["mode"] == "adaptive"
    best = max(rows[2:4], key=lambda r: r["events_s"])
    assert adaptive_cap["best_fixed_budget"] == best["max_batch_tokens"]
    loads = [(r["mode"], r["load"]) for r in rows if r["kind"] == "load"]
    assert loads == [("fixed", 0.5), ("fixed", 1.1), ("adaptive", 0.5), ("adaptive", 1.1)]
    assert rows[5]["rate"] == pytest.approx(0.5 * best["events_s"], abs=0.01)
    assert (tmp_path / "load.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot:" in (tmp_path / "load.log").read_text()
