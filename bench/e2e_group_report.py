"""`bench.e2e_group`'s report: the group's assignments read from the children's logs, the figures of a steady
load and of a fault run from the `Ledger`, and the text summary. Pure functions of what the run collected
(a `Child`'s lines are snapshots of its stderr).

Clocks: the ledger's times are `time.perf_counter()`, the children's log lines `time.monotonic()`; a
`FaultClock` holds one instant on both, and every figure is a difference on one clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from bench.children import Child
from bench.e2e_report import load_figures, quantiles_ms
from bench.e2e_traffic import Ledger

#: The fault run's modes whose children run `kafka.exactly_once` (the tail reads committed records only).
EOS_MODES = frozenset({"eos"})
#: `bench.e2e`'s load keys that need lag samples, which the group bench does not take.
_LAG_KEYS = ("lag_max", "lag_mean", "lag_at_end", "lag_series")


@dataclass(frozen=True, slots=True)
class FaultClock:
    """The moment of the kill on both clocks."""

    kill_perf: float
    kill_mono: float

    def perf(self, mono: float) -> float:
        """The `perf_counter` time of monotonic time `mono`."""
        return self.kill_perf + (mono - self.kill_mono)


def assignments(child: Child, since_mono: float = 0.0) -> list[tuple[float, list[int]]]:
    """Every `partitions_assigned` log line of `child` at or after `since_mono` (monotonic): its time and
    the input partitions (ints, sorted; the children read one input topic)."""
    return [
        (t, sorted(int(str(p).rpartition(":")[2]) for p in fields.get("partitions", [])))
        for t, fields in child.events("partitions_assigned")
        if t >= since_mono
    ]


def assignment(child: Child, since_mono: float) -> tuple[float, list[int]] | None:
    """The child's last assignment at or after `since_mono` (`assignments`); None when there is none."""
    found = assignments(child, since_mono)
    return found[-1] if found else None


def first_holding(children: Sequence[Child], partitions: Collection[int], since_mono: float) -> float | None:
    """The monotonic time by which `children`'s assignments logged at or after `since_mono` had covered
    every one of `partitions` (each partition's first such assignment, the latest of those); None when
    one of them was never covered (or `partitions` is empty)."""
    firsts: dict[int, float] = {}
    for child in children:
        for t, parts in assignments(child, since_mono):
            for part in parts:
                if part in partitions and (part not in firsts or t < firsts[part]):
                    firsts[part] = t
    if not partitions or set(partitions) - set(firsts):
        return None
    return max(firsts.values())


def steady_figures(ledger: Ledger, load: int, began: float, seconds: float) -> dict[str, Any]:
    """Load `load`'s figures (window from `began`, perf_counter): events, events/s in and out, decided,
    dead-lettered, undecided, latency p50/p95/p99/max from scheduled send to the tail consumer's hold, and
    the same from the record timestamps (`bench.e2e_report.load_figures` without the lag keys)."""
    figures = load_figures(ledger, load, began, seconds, [])
    return {k: v for k, v in figures.items() if k not in _LAG_KEYS}


def service_window(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, Any] | None:
    """One child's figures between two `/metrics` reads (`bench.e2e_group.scrape`): the GPU busy share
    (GPU-thread seconds over the seconds between the reads), batches, records run, and mean records and
    tokens per batch. None when either read failed."""
    if before is None or after is None:
        return None
    d = {k: after[k] - before[k] for k in after}
    batches = d["clef_router_batch_records_count"]
    return {
        "gpu_busy": round(d["clef_router_gpu_busy_seconds_total"] / max(1e-9, d["at"]), 3),
        "batches": int(batches),
        "records": int(d["clef_router_batch_records_sum"]),
        "records_per_batch": round(d["clef_router_batch_records_sum"] / batches, 2) if batches else 0.0,
        "tokens_per_batch": round(d["clef_router_batch_tokens_sum"] / batches) if batches else 0,
    }


def capacity_figures(ledger: Ledger, load: int, began: float) -> dict[str, Any]:
    """A backlog's drain (load `load`, sent at once from `began`, perf_counter): events, decided,
    dead-lettered, seconds from `began` to the last decision or dead letter, and decided events per
    second over them."""
    ids = [eid for eid, s in ledger.sent.items() if s.load == load]
    ends = [ledger.decided[e][0] for e in ids if e in ledger.decided] + [
        ledger.dead[e] for e in ids if e in ledger.dead
    ]
    seconds = max(ends, default=began) - began
    decided = sum(1 for e in ids if e in ledger.decided)
    return {
        "events": len(ids),
        "decided": decided,
        "dead_lettered": sum(1 for e in ids if e in ledger.dead),
        "seconds": round(seconds, 2),
        "events_s": round(decided / seconds, 2) if seconds > 0 else 0.0,
    }


def _first_decision(ledger: Ledger, ids: Sequence[str], after: float) -> float | None:
    """Seconds from `after` (perf) to the earliest decision among `ids`; None when none was decided."""
    times = [ledger.decided[eid][0] for eid in ids if eid in ledger.decided]
    return round(min(times) - after, 2) if times else None


def _rate_series(ledger: Ledger, ids: Sequence[str], zero: float, before_s: int) -> list[list[int]]:
    """Decisions per whole second relative to `zero` (perf): `[second, count]` from `-before_s` to the
    last decision's second."""
    seconds = Counter(int((ledger.decided[eid][0] - zero) // 1) for eid in ids if eid in ledger.decided)
    last = max(seconds, default=0)
    return [[s, seconds.get(s, 0)] for s in range(-before_s, last + 1)]


def fault_figures(
    ledger: Ledger,
    clock: FaultClock,
    orphaned: Sequence[int],
    *,
    survivors: Sequence[Child],
    restarted: Child,
    restart_ready_s: float,
    load: int = 1,
) -> dict[str, Any]:
    """The fault run's figures for load `load`:

    - the ledger: sent, decided, dead-lettered, lost (neither), duplicate decisions, send errors;
    - `orphaned_partitions`: the killed process's last assignment;
    - `survivor_assigned_s`: kill until the survivors' assignments covered every orphaned partition;
    - `orphaned_first_decision_s`: kill until the first decision of an event sent after the kill to an
      orphaned partition (whoever served it);
    - `restart_ready_s`, `restart_assigned_s` (spawn to its first non-empty assignment) and
      `restart_first_decision_s` (spawn to the first decision of an event sent after that assignment to
      one of its partitions);
    - latency p50/p95/p99/max of all decided events, of those sent in the 10 s after the kill, and
      `out_per_s_from_kill` (decisions per second, `[second from the kill, count]`, from 5 s before).
    """
    ids = [eid for eid, s in ledger.sent.items() if s.load == load]
    decided = [eid for eid in ids if eid in ledger.decided]
    wanted = set(ids)
    after_kill = [eid for eid in ids if ledger.sent[eid].due >= clock.kill_perf]
    orphan_ids = [eid for eid in after_kill if ledger.sent[eid].partition in set(orphaned)]
    covered = first_holding(survivors, orphaned, clock.kill_mono)

    held = [(t, parts) for t, parts in assignments(restarted) if parts]
    restart_assigned = held[0] if held else None
    restart_first: float | None = None
    if restart_assigned is not None:
        since = clock.perf(restart_assigned[0])
        own = set(restart_assigned[1])
        mine = [eid for eid in ids if ledger.sent[eid].due >= since and ledger.sent[eid].partition in own]
        first = _first_decision(ledger, mine, since)
        restart_first = None if first is None else round(first + restart_assigned[0] - restarted.spawned, 2)

    def latencies(subset: Sequence[str]) -> dict[str, float]:
        return quantiles_ms(
            [ledger.decided[e][0] - ledger.sent[e].due for e in subset if e in ledger.decided]
        )

    burst = [eid for eid in after_kill if ledger.sent[eid].due < clock.kill_perf + 10.0]
    return {
        "sent": len(ids),
        "decided": len(decided),
        "dead_lettered": sum(1 for eid in ids if eid in ledger.dead),
        "lost": sum(1 for eid in ids if eid not in ledger.decided and eid not in ledger.dead),
        "duplicates": sum(1 for eid in ledger.duplicated if eid in wanted),
        "send_errors": ledger.send_errors,
        "orphaned_partitions": list(orphaned),
        "orphaned_events_after_kill": len(orphan_ids),
        "survivor_assigned_s": None if covered is None else round(covered - clock.kill_mono, 2),
        "orphaned_first_decision_s": _first_decision(ledger, orphan_ids, clock.kill_perf),
        "restart_ready_s": round(restart_ready_s, 2),
        "restart_assigned_s": None
        if restart_assigned is None
        else round(restart_assigned[0] - restarted.spawned, 2),
        "restart_partitions": [] if restart_assigned is None else restart_assigned[1],
        "restart_first_decision_s": restart_first,
        "latency": latencies(ids),
        "latency_after_kill_10s": latencies(burst),
        "out_per_s_from_kill": _rate_series(ledger, ids, clock.kill_perf, 5),
    }


def _share(load: dict[str, Any]) -> str:
    return f" ({load['share']:g} of capacity)" if "share" in load else ""


def _service(per_child: Sequence[dict[str, Any] | None]) -> str:
    shown = ["-" if c is None else f"{c['gpu_busy']} / {c['records_per_batch']}" for c in per_child]
    return ", ".join(shown) or "-"


def _peaks(mib: Sequence[int | None]) -> str:
    return ", ".join("-" if m is None else f"{m / 1024:.2f}" for m in mib) or "-"


def summary_text(info: dict[str, Any], lines: Sequence[dict[str, Any]]) -> str:
    """What ran, one table row per steady load, one block per fault run."""
    head = [
        f"bench.e2e_group {info['date']}: {info['processes']} process(es), engine {info['engine']}"
        + (
            f" ({info['release']}, fp8 {info['fp8']}, {info['gpus']} GPU(s))"
            if info["engine"] == "release"
            else ""
        )
        + f", broker Apache Kafka {info['broker_version']}, {info['partitions']} input partitions, "
        f"{info['arrivals']} arrivals, session timeout {info['session_timeout_ms']} ms",
    ]
    for c in (ln for ln in lines if ln.get("kind") == "capacity"):
        head.append(
            f"capacity through Kafka ({c['processes']} process(es)): {c['events_s']} events/s, a backlog of "
            f"{c['events']} events drained in {c['seconds']} s ({c['decided']} decided, "
            f"{c['dead_lettered']} DLQ)"
        )
    loads = [ln for ln in lines if ln.get("kind") == "load"]
    if loads:
        head += [
            "",
            "| processes | rate/s | events/s in | events/s out | p50 ms | p95 ms | p99 ms | undecided | "
            "DLQ | GPU busy / records per batch, per process | GPU peak GiB per process | per GPU |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in loads:
            head.append(
                f"| {r['processes']} | {r['rate']:g}{_share(r)} | {r['events_in_s']} | {r['events_out_s']} | "
                f"{r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['undecided']} | {r['dead_lettered']} | "
                f"{_service(r.get('service', []))} | {_peaks(r['gpu_peak_mib'])} | "
                f"{_peaks(r.get('gpu_total_peak_mib', []))} |"
            )
    for f in (ln for ln in lines if ln.get("kind") == "fault"):
        lat, burst = f["latency"], f["latency_after_kill_10s"]
        head += [
            "",
            f"fault ({'exactly-once' if f['mode'] in EOS_MODES else 'at-least-once'}): {f['processes']} "
            f"processes at {f['rate']:g}/s for {f['seconds']:g} s, kill -9 of one at {f['kill_at_s']:g} s "
            f"(partitions {f['orphaned_partitions']})",
            f"  ledger: sent {f['sent']}, decided {f['decided']}, DLQ {f['dead_lettered']}, "
            f"lost {f['lost']}, duplicates {f['duplicates']}, send errors {f['send_errors']}",
            f"  kill -> survivor assigned the orphaned partitions {f['survivor_assigned_s']} s, "
            f"-> first decision of an event sent to them after the kill {f['orphaned_first_decision_s']} s",
            f"  restarted: ready {f['restart_ready_s']} s, assigned {f['restart_assigned_s']} s "
            f"({len(f['restart_partitions'])} partitions), first decision on them "
            f"{f['restart_first_decision_s']} s after spawn",
            f"  latency p50/p99/max ms: all {lat['p50_ms']} / {lat['p99_ms']} / {lat['max_ms']}; sent in the "
            f"10 s after the kill {burst['p50_ms']} / {burst['p99_ms']} / {burst['max_ms']}",
            f"  GPU peak GiB per process: {_peaks(f['gpu_peak_mib'])}; per GPU "
            f"{_peaks(f.get('gpu_total_peak_mib', []))}",
        ]
    return "\n".join(head) + "\n"
