"""`bench.e2e`'s traffic in and out of the service: the SystemOne events it sends, the open-loop producer that
sends them at a fixed rate (even or exponential gaps) or as a backlog (as fast as it goes), each with a
unique `ce_id` header, and the tail consumer that reads the decisions and the DLQ back, both into one
`Ledger` (also used by `bench.startup`); for the mixed run, `HttpLoad`, open-loop HTTP requests to the
service's API, one `HttpCall` each.

The ledger is written on the event loop only: `sent` and `send_errors` by `Producer`, the answers by
`Tail`; `bench.e2e_report` reads it and the calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

CE_ID = "ce_id"
LINGER_MS = 5
"""The load producer's batching delay (Kafka 4's producer default): part of every latency measured from the
scheduled send, since an event waits in the producer up to this long before it leaves for the broker."""


def event_values(requests: Sequence[Any]) -> list[bytes]:
    """The JSON record values of `requests` (SystemOne bodies: state and questions)."""
    return [r.model_dump_json().encode("utf-8") for r in requests]


@dataclass(slots=True)
class Sent:
    """One produced event: its load, scheduled send time (perf_counter), record timestamp (ms) and the input
    partition the broker put it in (-1 until acknowledged)."""

    load: int
    due: float
    timestamp_ms: int
    partition: int = -1


@dataclass(slots=True)
class Ledger:
    """What was sent and what came back, keyed by the `ce_id` header (event loop only)."""

    sent: dict[str, Sent] = field(default_factory=dict)
    decided: dict[str, tuple[float, int]] = field(default_factory=dict)  # id -> (perf_counter, record ts)
    dead: dict[str, float] = field(default_factory=dict)
    duplicates: int = 0
    duplicated: list[str] = field(default_factory=list)  # the id of every duplicate decision, in order
    unknown: int = 0
    send_errors: int = 0


class Tail:
    """Reads the decisions and DLQ topics from the beginning (fresh topics) into a `Ledger`."""

    def __init__(
        self,
        bootstrap: str,
        decisions: str,
        dlq: str,
        partitions: int,
        ledger: Ledger,
        *,
        read_committed: bool = False,
    ) -> None:
        """`read_committed`: only committed transactions' records (a consumer of an exactly-once service)."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        self._decisions = decisions
        self._tps = [TopicPartition(t, p) for t in (decisions, dlq) for p in range(partitions)]
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed" if read_committed else "read_uncommitted",
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
                        ledger.duplicated.append(eid)
                    else:
                        ledger.decided[eid] = (now, int(rec.timestamp))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()


async def arrivals(
    t0: float, rate: float, seconds: float, poisson: bool, rng: random.Random, stop: asyncio.Event
) -> AsyncIterator[tuple[int, float]]:
    """Open-loop send times from `t0` (perf_counter): `(index, due)` at `rate` per second for `seconds`
    (`poisson`: exponential gaps drawn from `rng`, else even ones), each yielded once its time has come.
    Ends early when `stop` is set."""
    i = 0
    due = t0
    while not stop.is_set():
        due = due + rng.expovariate(rate) if poisson else t0 + i / rate
        if due - t0 >= seconds:
            return
        delay = due - time.perf_counter()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                return
        yield i, due
        i += 1


class Producer:
    """Sends pool events to `topic` at a fixed rate (open loop) or as a backlog, each with a unique `ce_id`
    header: `{prefix}{load}-{i}` (producers into one ledger need distinct prefixes)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        values: Sequence[bytes],
        ledger: Ledger,
        seed: int,
        *,
        prefix: str = "L",
        linger_ms: int = LINGER_MS,
    ) -> None:
        from aiokafka import AIOKafkaProducer

        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=linger_ms
        )
        self._topic = topic
        self._values = values
        self._ledger = ledger
        self._rng = random.Random(seed)
        self._prefix = prefix

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def run(self, load: int, rate: float, seconds: float, poisson: bool, stop: asyncio.Event) -> float:
        """Send for `seconds` at `rate` events/s (`poisson`: exponential gaps, else even ones); returns the
        perf_counter time the window began. Stops early when `stop` is set. Waits for every acknowledgement
        (send errors are counted in the ledger)."""
        t0 = time.perf_counter()
        wall0 = time.time()
        acks = []
        async for i, due in arrivals(t0, rate, seconds, poisson, self._rng, stop):
            acks.append(await self._send(load, i, due, int((wall0 + (due - t0)) * 1000)))
        await self._settle(acks)
        return t0

    async def burst(self, load: int, count: int, stop: asyncio.Event) -> float:
        """Send `count` events as fast as the producer takes them (a backlog); each one's scheduled time is
        the moment it is handed to the producer. Returns the perf_counter time the burst began; stops
        early when `stop` is set; waits for every acknowledgement (send errors counted in the ledger)."""
        t0 = time.perf_counter()
        acks = []
        for i in range(count):
            if stop.is_set():
                break
            acks.append(await self._send(load, i, time.perf_counter(), int(time.time() * 1000)))
        await self._settle(acks)
        return t0

    async def _send(self, load: int, i: int, due: float, ts: int) -> asyncio.Future[Any]:
        """Record event `i` of `load` in the ledger and hand it to the producer; returns its ack future."""
        eid = f"{self._prefix}{load}-{i}"
        sent = self._ledger.sent[eid] = Sent(load, due, ts)
        rng = self._rng
        value = self._values[rng.randrange(len(self._values))]
        key = f"k{rng.randrange(1000)}".encode()
        ack: asyncio.Future[Any] = await self._producer.send(
            self._topic, value, key=key, headers=[(CE_ID, eid.encode())], timestamp_ms=ts
        )

        def acknowledged(done: asyncio.Future[Any]) -> None:
            if not done.cancelled() and done.exception() is None:
                sent.partition = int(done.result().partition)

        ack.add_done_callback(acknowledged)
        return ack

    async def _settle(self, acks: Sequence[asyncio.Future[Any]]) -> None:
        results = await asyncio.gather(*acks, return_exceptions=True)
        self._ledger.send_errors += sum(1 for r in results if isinstance(r, BaseException))


@dataclass(slots=True)
class HttpCall:
    """One HTTP request: its scheduled send time and, once it ended, when, with which status (or which
    client error instead: a timeout, a refused connection)."""

    due: float
    done: float | None = None
    status: int | None = None
    error: str | None = None


class HttpLoad:
    """Open-loop `POST {base_url}/v1/systemone` of pool bodies at Poisson times, one task per request over
    one keep-alive `httpx.AsyncClient` (proxies from the environment ignored: loopback). `calls` is
    written by this object's tasks only, on the event loop."""

    PATH = "/v1/systemone"

    def __init__(self, base_url: str, bodies: Sequence[bytes], seed: int, timeout_s: float) -> None:
        import httpx

        self._client = httpx.AsyncClient(base_url=base_url, timeout=timeout_s, trust_env=False)
        self._bodies = bodies
        self._rng = random.Random(seed)
        self.calls: list[HttpCall] = []
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def pending(self) -> int:
        """Requests sent and not yet ended."""
        return len(self._tasks)

    async def run(self, rate: float, seconds: float, stop: asyncio.Event) -> float:
        """Start requests at `rate` per second (exponential gaps) for `seconds`; returns the perf_counter
        time the window began, without waiting for the answers (`pending`). Stops early when `stop` is
        set."""
        rng = self._rng
        t0 = time.perf_counter()
        async for _, due in arrivals(t0, rate, seconds, True, rng, stop):
            call = HttpCall(due)
            self.calls.append(call)
            task = asyncio.create_task(self._post(call, self._bodies[rng.randrange(len(self._bodies))]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return t0

    async def _post(self, call: HttpCall, body: bytes) -> None:
        try:
            response = await self._client.post(
                self.PATH, content=body, headers={"content-type": "application/json"}
            )
            call.status = response.status_code
        except Exception as exc:  # httpx.HTTPError mostly (timeout, refused): the call's error, not the run's
            call.error = type(exc).__name__
        call.done = time.perf_counter()

    async def stop(self) -> None:
        """Cancel the requests still waiting (they stay unanswered in `calls`) and close the client."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._client.aclose()
