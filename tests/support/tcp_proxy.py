"""A loopback TCP proxy for fault tests: clients connect to it, it forwards to a broker listener, and a test
can add latency, blackhole (a network partition) or cut every connection.

It runs its own event loop in a daemon thread, so it keeps forwarding whatever the test's loop is doing;
the control methods are thread-safe and return at once. Test-only.

- `delay(seconds)`: every chunk is delivered `seconds` after it was read, in each direction (latency,
  not a bandwidth cap: chunks are timed independently).
- `blackhole()`: nothing is read or delivered and new connections are accepted but not forwarded, like a
  partition during which TCP keeps retransmitting; `heal()` lets the held data flow again.
- `cut()`: close every open connection now (new ones are forwarded normally).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from devtools.kafka_local import HOST


class TcpProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`target_port`. `start()` before use, `stop()` at the end."""

    def __init__(self, target_port: int, port: int) -> None:
        self.port = port
        self.target_port = target_port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._open: asyncio.Event | None = None
        self._delay = 0.0
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.connections = 0

    def start(self) -> None:
        """Listen (blocking until bound)."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)

    def stop(self) -> None:
        """Close every connection and the listener, end the thread."""
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def delay(self, seconds: float) -> None:
        """Deliver each chunk `seconds` after it was read (0: no added latency)."""
        self._delay = seconds

    def blackhole(self) -> None:
        """Stop moving bytes in both directions; connections stay open (a partition)."""
        self._loop.call_soon_threadsafe(self._event().clear)

    def heal(self) -> None:
        """End a blackhole: held bytes flow again."""
        self._loop.call_soon_threadsafe(self._event().set)

    def cut(self) -> None:
        """Close every open connection (both sides) now."""
        asyncio.run_coroutine_threadsafe(self._cut(), self._loop).result(10)

    # ---- inside the proxy's loop ---------------------------------------------------------------------
    def _event(self) -> asyncio.Event:
        assert self._open is not None, "start() first"
        return self._open

    async def _listen(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._server = await asyncio.start_server(self._serve, HOST, self.port)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._cut()

    async def _cut(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(client_w)
        try:
            await self._event().wait()  # a partition: the connection is accepted, never forwarded
            try:
                upstream_r, upstream_w = await asyncio.open_connection(HOST, self.target_port)
            except OSError:
                return  # broker down: the client sees the connection close
            self._writers.add(upstream_w)
            pumps = [
                asyncio.create_task(self._pump(client_r, upstream_w)),
                asyncio.create_task(self._pump(upstream_r, client_w)),
            ]
            _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            upstream_w.transport.abort()
            self._writers.discard(upstream_w)
        finally:
            client_w.transport.abort()
            self._writers.discard(client_w)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy `reader` to `writer` through a queue of (due time, chunk) until EOF or an error."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(self._send(queue, writer))
        try:
            while True:
                await self._event().wait()
                data = await reader.read(65536)
                if not data or sender.done():
                    return
                await self._event().wait()  # read during a blackhole: hold it until healed
                queue.put_nowait((time.monotonic() + self._delay, data))
        except (OSError, asyncio.IncompleteReadError):
            return
        finally:
            sender.cancel()

    async def _send(self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while True:
                due, data = await queue.get()
                await self._event().wait()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
