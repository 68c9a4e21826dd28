"""`bench.e2e_group_report`: assignments read from a child's log lines and the fault figures of a ledger
(fake children: only their log lines and spawn time are read)."""

from __future__ import annotations

import json
import subprocess
from typing import cast

from bench.children import Child
from bench.e2e_group_report import (
    FaultClock,
    assignment,
    capacity_figures,
    fault_figures,
    first_holding,
    service_window,
    summary_text,
)
from bench.e2e_traffic import Ledger, Sent


def _child(spawned: float, assigned: list[tuple[float, list[int]]]) -> Child:
    child = Child(cast(subprocess.Popen[bytes], None), spawned)
    for t, parts in assigned:
        line = {"event": "partitions_assigned", "partitions": [f"in:{p}" for p in parts], "level": "info"}
        child.lines.append((t - spawned, json.dumps(line)))
    child.lines.append((0.5, "not json: partitions_assigned"))
    return child


def test_assignment_is_the_last_one_since() -> None:
    child = _child(100.0, [(101.0, list(range(12))), (105.0, [1, 3, 5])])
    assert assignment(child, 0.0) == (105.0, [1, 3, 5])
    assert assignment(child, 106.0) is None
    assert first_holding([child], [1, 3], 100.0) == 101.0
    assert first_holding([child], [1, 3], 102.0) == 105.0
    assert first_holding([child], [1, 2], 102.0) is None
    assert first_holding([child], [], 0.0) is None


def test_fault_figures_count_the_ledger_and_time_the_takeover() -> None:
    ledger = Ledger()
    # kill at perf 50 == monotonic 1000; events every second from perf 40 to 69, partition = i % 4
    for i in range(30):
        ledger.sent[f"L1-{i}"] = Sent(1, 40.0 + i, 0, partition=i % 4)
    for i in range(30):
        due = 40.0 + i
        if i == 29:
            continue  # lost
        if i % 4 in (1, 3) and 50.0 <= due < 58.0:
            ledger.decided[f"L1-{i}"] = (58.5 + 0.01 * i, 0)  # the orphaned ones wait for the takeover
        else:
            ledger.decided[f"L1-{i}"] = (due + 0.1, 0)
    ledger.duplicated.append("L1-3")
    ledger.duplicates = 1
    survivor = _child(990.0, [(991.0, [0, 2]), (1008.0, [0, 1, 2, 3])])
    restarted = _child(1010.0, [(1013.0, []), (1014.0, [1, 3])])
    clock = FaultClock(kill_perf=50.0, kill_mono=1000.0)
    f = fault_figures(ledger, clock, [1, 3], survivors=[survivor], restarted=restarted, restart_ready_s=2.5)
    assert (f["sent"], f["decided"], f["lost"], f["duplicates"], f["dead_lettered"]) == (30, 29, 1, 1, 0)
    assert f["orphaned_events_after_kill"] == 10  # dues 50..69 on partitions 1 and 3
    assert f["survivor_assigned_s"] == 8.0
    assert f["orphaned_first_decision_s"] == 8.61  # event 11 (due 51), decided 58.61
    assert (f["restart_assigned_s"], f["restart_partitions"]) == (4.0, [1, 3])
    # assigned at monotonic 1014 == perf 64: the first event after it on 1 or 3 is due 65, decided 65.1
    assert f["restart_first_decision_s"] == 5.1
    assert f["out_per_s_from_kill"][0] == [-5, 1]
    assert sum(n for _, n in f["out_per_s_from_kill"]) == 29 - 5  # decided before second -5 left out
    assert f["latency"]["max_ms"] > 7000


def test_summary_names_the_modes() -> None:
    info = {"date": "d", "processes": 2, "engine": "stub", "release": "None", "fp8": "off", "gpus": 1,
            "broker_version": "4", "partitions": 12, "arrivals": "poisson",
            "session_timeout_ms": 6000}  # fmt: skip
    q = {"p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0, "max_ms": 4.0}
    fault = {"kind": "fault", "mode": "eos", "processes": 2, "rate": 20.0, "seconds": 10.0, "kill_at_s": 3.0,
             "orphaned_partitions": [1], "sent": 5, "decided": 5, "dead_lettered": 0, "lost": 0,
             "duplicates": 0, "send_errors": 0, "survivor_assigned_s": 6.1, "orphaned_first_decision_s": 6.2,
             "restart_ready_s": 2.0, "restart_assigned_s": 2.1, "restart_partitions": [1],
             "restart_first_decision_s": 2.3, "latency": q, "latency_after_kill_10s": q,
             "gpu_peak_mib": [2048, None]}  # fmt: skip
    text = summary_text(info, [fault])
    assert "fault (exactly-once)" in text
    assert "lost 0, duplicates 0" in text
    assert "GPU peak GiB per process: 2.00, -" in text


def test_capacity_is_decided_events_over_the_drain() -> None:
    ledger = Ledger()
    for i in range(10):
        ledger.sent[f"L3-{i}"] = Sent(3, 10.0, 0)
    for i in range(8):
        ledger.decided[f"L3-{i}"] = (10.5 + 0.25 * i, 0)  # last decision at 12.25
    ledger.dead["L3-8"] = 12.5  # the drain ends with the last answer of either kind
    ledger.sent["L1-0"] = Sent(1, 0.0, 0)
    f = capacity_figures(ledger, 3, 10.0)
    assert (f["events"], f["decided"], f["dead_lettered"], f["seconds"]) == (10, 8, 1, 2.5)
    assert f["events_s"] == 3.2


def test_service_window_is_the_difference_of_two_reads() -> None:
    names = ("gpu_busy_seconds_total", "batch_records_count", "batch_records_sum", "batch_tokens_sum")
    before = {f"clef_router_{n}": v for n, v in zip(names, (1.0, 10.0, 40.0, 4000.0), strict=True)}
    after = {f"clef_router_{n}": v for n, v in zip(names, (4.0, 14.0, 60.0, 6000.0), strict=True)}
    before["at"], after["at"] = 100.0, 110.0
    assert service_window(before, after) == {
        "gpu_busy": 0.3,
        "batches": 4,
        "records": 20,
        "records_per_batch": 5.0,
        "tokens_per_batch": 500,
    }
    assert service_window(None, after) is None
