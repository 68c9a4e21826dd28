"""`bench.batcher_model`: the GPU idle it counts, and one short run through the service's batcher."""

from __future__ import annotations

import asyncio

import pytest

from bench.batcher_model import PaddedCost, Run, TimedEngine, cost_error, drive, idle_waiting, padded
from bench.queue_model import Cost, poisson_arrivals
from consumer.batching.batch_metrics import observe_cost
from consumer.metrics import Metrics
from consumer.settings import BatchingSettings
from devtools.stub import StubEngine
from schemas.systemone import parse_request


def test_idle_counts_only_gaps_before_a_batch_whose_record_had_arrived() -> None:
    runs = [
        Run(1.0, 2.0, (0.5,)),
        Run(2.5, 3.0, (1.5,)),  # its record arrived while the first ran: 0.5 s idle with work waiting
        Run(4.0, 5.0, (3.5,)),  # its record arrived after the GPU went idle: not counted
        Run(5.0, 6.0, (4.5,)),  # no gap
    ]
    assert idle_waiting(list(reversed(runs))) == [0.5, 0.0]


def test_every_event_is_answered_once_through_the_batcher() -> None:
    request = parse_request({"state": "s", "questions": {"o": {"type": "noul", "instructions": "?"}}})
    answer = StubEngine().execute([StubEngine().prepare(request)])[0]
    engine = TimedEngine(Cost(0.001, 0.001, 690.0), 0.0001, 0.0, 0.0, answer)
    schedule = [(at, round(tokens)) for at, tokens in poisson_arrivals(200.0, 40, seed=3)]
    latencies = asyncio.run(drive(engine, BatchingSettings(), schedule, 0.0001))
    assert len(latencies) == 40
    assert all(0.0 < s < 5.0 for s in latencies)
    arrivals = sorted(at for run in engine.runs for at in run.arrivals)
    assert len(arrivals) == len(set(arrivals)) == 40  # each record ran in exactly one batch
    assert all(run.end > run.start for run in engine.runs)


def test_staging_that_waits_for_the_running_batch_ends_after_it() -> None:
    import threading
    import time

    request = parse_request({"state": "s", "questions": {"o": {"type": "noul", "instructions": "?"}}})
    answer = StubEngine().execute([StubEngine().prepare(request)])[0]
    engine = TimedEngine(Cost(0.2, 0.0, 690.0), 0.0, 0.0, 0.0, answer, stage_waits_for_run=True)
    engine.stage([])  # nothing running: no wait
    running = threading.Thread(target=engine.run, args=([],))
    running.start()
    while not engine.runs and engine._idle.is_set():  # until the run has begun
        time.sleep(0.001)
    engine.stage([])
    staged_at = time.perf_counter()
    running.join(5)
    assert engine.runs
    assert staged_at >= engine.runs[0].end - 0.01  # staging ended with the run, not before it


def test_jitter_spreads_each_run_within_its_bound() -> None:
    request = parse_request({"state": "s", "questions": {"o": {"type": "noul", "instructions": "?"}}})
    answer = StubEngine().execute([StubEngine().prepare(request)])[0]
    plain = TimedEngine(Cost(0.01, 0.0, 690.0), 0.0, 0.0, 0.0, answer)
    jittered = TimedEngine(Cost(0.01, 0.0, 690.0), 0.0, 0.0, 0.0, answer, jitter=0.5)
    for engine in (plain, jittered):
        for _ in range(12):
            engine.run([])
    plain_s = [r.end - r.start for r in plain.runs]
    jittered_s = [r.end - r.start for r in jittered.runs]
    assert all(s >= 0.01 for s in plain_s)
    assert all(0.005 <= s < 0.015 + 0.05 for s in jittered_s)  # a sleep may overshoot, never undershoot
    assert min(jittered_s) < 0.0095 < max(jittered_s)  # 12 seeded draws from [0.5, 1.5]: some below 0.95


def test_modelled_launches_starve_the_gpu_of_a_piece_launched_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """With launches modelled: one launch per graph piece of 48 layers, then the head's; a piece runs on the
    modelled GPU from its launch or the previous piece's end, so a launch held up (here the second piece's,
    by 30 ms, as a GIL wait would) delays the rest of the decoder and the head by as much. Launches on time
    hide under the GPU time."""
    import time

    import bench.batcher_model as model

    calls: list[int] = []
    hold_second = [False]

    def launch(ops: int) -> float:
        calls.append(ops)
        if hold_second[0] and len(calls) == 2:
            time.sleep(0.03)
        return 0.0

    monkeypatch.setattr(model, "launches", launch)
    request = parse_request({"state": "s", "questions": {"o": {"type": "noul", "instructions": "?"}}})
    answer = StubEngine().execute([StubEngine().prepare(request)])[0]
    engine = TimedEngine(Cost(0.02, 0.0, 690.0), 0.0, 0.0, 0.0, answer, launch_ops=50)
    engine.run([])
    assert calls == [1] * 7 + [50]  # pieces of 2 and then 8 layers, then the head
    on_time = engine.runs[-1].end - engine.runs[-1].start
    calls.clear()
    hold_second[0] = True
    engine.run([])
    late = engine.runs[-1].end - engine.runs[-1].start
    assert 0.02 <= on_time < late
    # piece 1 (2 of 48 layers of the 19 ms decoder) ran meanwhile; the other 46 layers and the 1 ms head after
    assert late >= 0.03 + 0.019 * 46 / 48 + 0.001


def test_cost_error_gives_the_share_over_and_the_mean_error_each_way() -> None:
    m = Metrics()
    assert cost_error(m) == {"over_share": 0.0, "over_ms_mean": 0.0, "under_ms_mean": 0.0}
    for predicted, seconds in ((0.010, 0.012), (0.010, 0.014), (0.010, 0.009), (0.020, 0.019)):
        observe_cost(m, predicted, seconds, learn=True)
    observe_cost(m, 0.010, 0.050, learn=False)  # a split batch: not a clean run
    observe_cost(m, None, 0.050, learn=True)  # before the first fit
    assert cost_error(m) == {"over_share": 0.5, "over_ms_mean": 3.0, "under_ms_mean": 1.0}


def test_a_batch_costs_the_graph_bucket_that_holds_it_and_its_own_tokens_above_the_largest() -> None:
    buckets = (512, 1024, 2048)
    assert [padded(t, buckets) for t in (1, 512, 513, 2048, 2049, 5000)] == [512, 512, 1024, 2048, 2049, 5000]
    assert padded(700, ()) == 700


def test_the_padded_cost_model_fits_bucket_times_and_answers_budgets_in_buckets() -> None:
    cost = PaddedCost((512, 1024, 2048))
    cost.observe(600, 0.002 + 1e-6 * 1024)  # both ran their buckets' graphs: 1 ms per 1,000 tokens + 2 ms
    cost.observe(1500, 0.002 + 1e-6 * 2048)
    assert cost.predict(900) == pytest.approx(0.002 + 1e-6 * 1024)
    assert cost.predict(3000) == pytest.approx(0.002 + 1e-6 * 3000)  # eager above the largest bucket
    assert cost.tokens_within(0.002 + 1e-6 * 1500) == 1024  # 1,500 tokens would pad to 2,048
    assert cost.tokens_within(0.002 + 1e-6 * 100) == 512  # anything up to 512 costs the same
    assert cost.tokens_within(0.002 + 1e-6 * 4000) == 4000
    assert PaddedCost((512,)).tokens_within(1.0) is None  # no fit yet


def test_a_batch_launched_while_another_runs_starts_on_the_modelled_device_at_its_end() -> None:
    """`TimedEngine.launch` queues on one modelled device: the second launch returns at once and its batch
    starts where the first ends; each wait gives its batch's device seconds. Through the batcher with
    `launch_ahead`, every event is still answered once."""
    from bench.batcher_model import TimedRecord

    request = parse_request({"state": "s", "questions": {"o": {"type": "noul", "instructions": "?"}}})
    answer = StubEngine().execute([StubEngine().prepare(request)])[0]
    engine = TimedEngine(Cost(0.05, 0.0, 690.0), 0.0, 0.0, 0.0, answer)
    first = engine.launch([TimedRecord(10, 0.0)])
    second = engine.launch([TimedRecord(10, 0.0)])
    assert second.start == first.end  # queued behind the first, not started at its launch
    (_, s1), (_, s2) = first.wait(), second.wait()
    assert s1 == pytest.approx(0.05)
    assert s2 == pytest.approx(0.05)
    assert [(r.start, round(r.end - r.start, 2)) for r in engine.runs][1][0] == first.end
    schedule = [(at, round(tokens)) for at, tokens in poisson_arrivals(200.0, 40, seed=3)]
    quick = TimedEngine(Cost(0.001, 0.001, 690.0), 0.0001, 0.0, 0.0, answer, launch_host_s=0.0002)
    latencies = asyncio.run(drive(quick, BatchingSettings(launch_ahead=True), schedule, 0.0001))
    assert len(latencies) == 40
    arrivals = sorted(at for run in quick.runs for at in run.arrivals)
    assert len(arrivals) == len(set(arrivals)) == 40
