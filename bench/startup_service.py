"""The service side of `bench.startup`: a `clef-router` child process timed from spawn to ready and to its
first answers, and the kill -9 restart with a Kafka backlog (see `bench.startup`'s docstring)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from typing import Any

from bench.children import http_get, kill, spawn, stopped, wait_ready

REQUEST = {
    "model": "clef-omni",
    "state": "disk full on db-01 after the nightly backup; writes failing on the payment service",
    "questions": {
        "department": {"type": "choice", "criteria": {"storage": "disks", "network": None, "database": None}},
        "urgency": {"type": "score", "criteria": ["low", "medium", "high", "critical"]},
        "outage": {"type": "noul"},
    },
}


def _env(args: argparse.Namespace, port: int, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEF_")}
    env.update(
        CLEF_ENGINE__MODEL_PATH=str(args.release),
        CLEF_ENGINE__DEVICE=args.device,
        CLEF_ENGINE__DTYPE="bfloat16" if args.device == "cuda" else "float32",
        CLEF_HTTP__HOST="127.0.0.1",
        CLEF_HTTP__PORT=str(port),
        CLEF_LOG_LEVEL="info",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    if args.triton_cache is not None:
        env["TRITON_CACHE_DIR"] = str(args.triton_cache)
    if args.site is not None:  # only the product's dependency closure (`bench.closure_site`)
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([*paths, str(args.site), os.getcwd()])
        env["BENCH_CLOSURE_SITE"] = str(args.site)
    return env


def serve_run(args: argparse.Namespace) -> dict[str, Any]:
    """`clef-router serve` on the release: spawn to ready, then two requests (first and second answer)."""
    from devtools.kafka_local import free_port

    port = free_port()
    body = json.dumps(REQUEST).encode()
    with stopped(spawn(["serve"], _env(args, port, {}))) as child:
        ready_s = wait_ready(child, port, args.timeout_s)
        answers = []
        for _ in range(3):
            t = time.monotonic()
            status, reply = http_get(f"http://127.0.0.1:{port}/v1/systemone", body)
            answers.append(
                (status, round((time.monotonic() - t) * 1000, 1), reply[:200].decode("utf-8", "replace"))
            )
        first_s = time.monotonic() - child.spawned
    return {
        "what": "serve",
        "ready_s": round(ready_s, 2),
        "first_answer_done_s": round(first_s, 2),
        "answers_ms": [a[1] for a in answers],
        "answer_status": [a[0] for a in answers],
        "answer_head": answers[0][2],
        "timeline": child.timeline(),
    }


def restart_run(args: argparse.Namespace) -> dict[str, Any]:
    """`clef-router run` with a backlog: kill -9 once decisions flow, start again, time the recovery."""
    return asyncio.run(_restart(args))


async def _restart(args: argparse.Namespace) -> dict[str, Any]:
    from bench.e2e_traffic import Ledger, Producer, Tail, event_values
    from bench.load import build, make_pool
    from consumer.kafka.access import service_topics
    from consumer.settings import load_settings
    from devtools.kafka_local import LocalKafka, free_port

    partitions = 6
    broker = LocalKafka()
    await asyncio.to_thread(broker.start)
    try:
        kafka: dict[str, Any] = {"bootstrap_servers": broker.bootstrap_servers}
        if args.session_timeout_ms:
            kafka["session_timeout_ms"] = args.session_timeout_ms
        settings = load_settings(kafka=kafka)
        topics = settings.topics
        names = service_topics(topics, settings.routing.department_map.values())
        await asyncio.to_thread(broker.create_topics, names, partitions=partitions)
        sizing = await asyncio.to_thread(build, True, 65_536)  # the tiny release sizes the events
        values = event_values(make_pool(sizing, random.Random(0), 256))
        ledger = Ledger()
        producer = Producer(broker.bootstrap_servers, topics.input[0], values, ledger, seed=3)
        tail = Tail(broker.bootstrap_servers, topics.decisions, topics.dlq, partitions, ledger)
        await producer.start()
        await tail.start()
        never = asyncio.Event()
        rate = max(args.backlog / 2.0, 1.0)
        await producer.run(0, rate, args.backlog / rate, False, never)  # the backlog, in about 2 s
        sent = len(ledger.sent)
        port = free_port()
        extra = {"CLEF_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap_servers}
        if args.session_timeout_ms:
            extra["CLEF_KAFKA__SESSION_TIMEOUT_MS"] = str(args.session_timeout_ms)
        env = _env(args, port, extra)
        first = spawn(["run"], env)
        with stopped(first):
            ready1 = await asyncio.to_thread(wait_ready, first, port, args.timeout_s)
            await _until(lambda: len(ledger.decided) >= min(300, sent // 4), args.timeout_s)
            before_kill = len(ledger.decided)
            kill(first)
            killed = time.monotonic()
        second = spawn(["run"], env)
        with stopped(second):
            seen = len(ledger.decided) + ledger.duplicates
            ready_task = asyncio.create_task(asyncio.to_thread(wait_ready, second, port, args.timeout_s))
            await _until(lambda: len(ledger.decided) + ledger.duplicates > seen, args.timeout_s)
            flowing = time.monotonic() - killed
            ready2 = await ready_task
            await _until(lambda: len(ledger.decided) + len(ledger.dead) >= sent, args.timeout_s)
            drained = time.monotonic() - killed
        await producer.stop()
        await tail.stop()
    finally:
        await asyncio.to_thread(broker.stop)
    lost = sent - len(ledger.decided) - len(ledger.dead)
    return {
        "what": "restart",
        "backlog": sent,
        "first_ready_s": round(ready1, 2),
        "decided_before_kill": before_kill,
        "kill_to_decisions_flowing_s": round(flowing, 2),
        "restart_ready_s": round(ready2, 2),
        "session_timeout_ms": settings.kafka.session_timeout_ms,
        "kill_to_backlog_drained_s": round(drained, 2),
        "sent": sent,
        "decided": len(ledger.decided),
        "dead_lettered": len(ledger.dead),
        "lost": lost,
        "duplicates": ledger.duplicates,
        "timeline_restart": second.timeline(),
    }


async def _until(condition: Any, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {limit_s:.0f} s")
        await asyncio.sleep(0.02)
