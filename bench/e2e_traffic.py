"""`bench.e2e`'s traffic in and out of the service: the SystemOne events it sends, the open-loop producer that
sends them at a fixed rate (even or exponential gaps), each with a unique `ce_id` header, and the tail
consumer that reads the decisions and the DLQ back, both into one `Ledger` (also used by `bench.startup`).

The ledger is written on the event loop only: `sent` and `send_errors` by `Producer`, the answers by
`Tail`; `bench.e2e_report` reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

CE_ID = "ce_id"


def event_values(requests: Sequence[Any]) -> list[bytes]:
    """The JSON record values of `requests` (SystemOne bodies: state and questions)."""
    return [r.model_dump_json().encode("utf-8") for r in requests]


@dataclass(slots=True)
class Sent:
    """One produced event: its load, scheduled send time (perf_counter) and record timestamp (ms)."""

    load: int
    due: float
    timestamp_ms: int


@dataclass(slots=True)
class Ledger:
    """What was sent and what came back, keyed by the `ce_id` header (event loop only)."""

    sent: dict[str, Sent] = field(default_factory=dict)
    decided: dict[str, tuple[float, int]] = field(default_factory=dict)  # id -> (perf_counter, record ts)
    dead: dict[str, float] = field(default_factory=dict)
    duplicates: int = 0
    unknown: int = 0
    send_errors: int = 0


class Tail:
    """Reads the decisions and DLQ topics from the beginning (fresh topics) into a `Ledger`."""

    def __init__(self, bootstrap: str, decisions: str, dlq: str, partitions: int, ledger: Ledger) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        self._decisions = decisions
        self._tps = [TopicPartition(t, p) for t in (decisions, dlq) for p in range(partitions)]
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        self._ledger = ledger
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._consumer.start()
        self._consumer.assign(self._tps)
        await self._consumer.seek_to_beginning(*self._tps)
        self._task = asyncio.create_task(self._loop(), name="e2e-tail")

    async def _loop(self) -> None:
        ledger = self._ledger
        while True:
            batch = await self._consumer.getmany(timeout_ms=100, max_records=2000)
            now = time.perf_counter()
            for tp, records in batch.items():
                for rec in records:
                    eid = next((v.decode() for k, v in rec.headers or () if k == CE_ID and v), None)
                    if eid is None or eid not in ledger.sent:
                        ledger.unknown += 1
                    elif tp.topic != self._decisions:
                        ledger.dead.setdefault(eid, now)
                    elif eid in ledger.decided:
                        ledger.duplicates += 1
                    else:
                        ledger.decided[eid] = (now, int(rec.timestamp))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()


class Producer:
    """Sends pool events at a fixed rate (open loop), each with a unique `ce_id` header."""

    def __init__(
        self, bootstrap: str, topic: str, values: Sequence[bytes], ledger: Ledger, seed: int
    ) -> None:
        from aiokafka import AIOKafkaProducer

        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5
        )
        self._topic = topic
        self._values = values
        self._ledger = ledger
        self._rng = random.Random(seed)

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def run(self, load: int, rate: float, seconds: float, poisson: bool, stop: asyncio.Event) -> float:
        """Send for `seconds` at `rate` events/s (`poisson`: exponential gaps, else even ones); returns the
        perf_counter time the window began. Stops early when `stop` is set. Waits for every acknowledgement
        (send errors are counted in the ledger)."""
        rng, ledger = self._rng, self._ledger
        t0 = time.perf_counter()
        wall0 = time.time()
        acks = []
        i = 0
        due = t0
        while not stop.is_set():
            due = due + rng.expovariate(rate) if poisson else t0 + i / rate
            if due - t0 >= seconds:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    break
            eid = f"L{load}-{i}"
            ts = int((wall0 + (due - t0)) * 1000)
            ledger.sent[eid] = Sent(load, due, ts)
            value = self._values[rng.randrange(len(self._values))]
            key = f"k{rng.randrange(1000)}".encode()
            acks.append(
                await self._producer.send(
                    self._topic, value, key=key, headers=[(CE_ID, eid.encode())], timestamp_ms=ts
                )
            )
            i += 1
        results = await asyncio.gather(*acks, return_exceptions=True)
        ledger.send_errors += sum(1 for r in results if isinstance(r, BaseException))
        return t0
