"""A real single-node Apache Kafka broker (KRaft, broker + controller in one JVM) on loopback.

Used by the pytest fixtures and by ``clef-router kafka-local``. The broker runs from the jars that
``devtools.kafka_jars`` fetches; nothing here mocks Kafka.

Lifecycle (all methods blocking and bounded; call them from a worker thread inside an event loop, e.g.
``await asyncio.to_thread(broker.restart)``):

    broker = LocalKafka()
    broker.start()                 # free ports, format, launch JVM, wait until describe_cluster answers
    broker.create_topics(["t"])    # through an aiokafka admin client
    broker.restart()               # same ports, same data
    broker.stop()                  # SIGTERM, then SIGKILL after a bound; temp data removed

Only 127.0.0.1 is ever used.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import structlog

from devtools.kafka_jars import KAFKA_VERSION, ensure_kafka_jars

HOST = "127.0.0.1"
_log = structlog.get_logger(__name__)
_T = TypeVar("_T")
_LIVE: weakref.WeakSet[LocalKafka] = weakref.WeakSet()
_VERSION_RE = re.compile(r"Kafka version: (\S+)")


class BrokerError(RuntimeError):
    """The broker could not be formatted, started, reached or stopped."""


class PortInUseError(BrokerError):
    """The JVM exited because one of its listener ports was taken."""


@dataclass(frozen=True, slots=True)
class ExtraListener:
    """A listener besides PLAINTEXT and CONTROLLER (secured brokers, fault proxies in the tests).

    ``name``: listener name (upper case); ``protocol``: its security protocol (SSL, SASL_SSL, ...);
    ``port``: where the broker binds it on 127.0.0.1; ``advertised_port``: the port clients are told to
    use (a proxy's, for fault tests; default ``port``).
    """

    name: str
    protocol: str
    port: int
    advertised_port: int | None = None


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def new_cluster_id() -> str:
    """16 random bytes, URL-safe base64 without padding, never starting with '-' (KRaft's format)."""
    for _ in range(100):
        cid = base64.urlsafe_b64encode(secrets.token_bytes(16)).decode("ascii").rstrip("=")
        if not cid.startswith("-"):
            return cid
    raise BrokerError("could not generate a cluster id")  # 2**-100 chance


def run_coroutine(coro: Coroutine[Any, Any, _T], timeout_s: float) -> _T:
    """Run ``coro`` to completion on a private event loop in a helper thread and return its result.

    Works whether or not the caller already runs an event loop (the caller blocks meanwhile).
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-kafka") as pool:
        return pool.submit(asyncio.run, coro).result(timeout=timeout_s)


class LocalKafka:
    """One local Apache Kafka broker process.

    ``port``: the client port (None = pick a free one, retried on a clash). ``data_dir``: keep the
    broker's files there across runs (None = a temporary folder removed by ``stop``).
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        version: str = KAFKA_VERSION,
        heap_mb: int = 768,
        ready_timeout_s: float = 60.0,
        stop_timeout_s: float = 30.0,
        start_attempts: int = 3,
        extra_listeners: Sequence[ExtraListener] = (),
        extra_properties: Mapping[str, str] | None = None,
        format_args: Sequence[str] = (),
    ) -> None:
        """``extra_listeners``, ``extra_properties`` (server.properties entries, overriding ours) and
        ``format_args`` (added to ``kafka-storage format``, e.g. ``--add-scram``) are hooks for test
        brokers with TLS, SASL or ACLs; the PLAINTEXT listener stays (readiness probe, admin)."""
        self._extra_listeners = tuple(extra_listeners)
        self._extra_properties = dict(extra_properties or {})
        self._format_args = list(format_args)
        self._fixed_port = port
        self._keep_data = data_dir is not None
        self._data_dir_arg = Path(data_dir).resolve() if data_dir is not None else None
        self.version = version
        self._heap_mb = heap_mb
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._start_attempts = max(1, start_attempts)
        self._run_dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._controller_port: int | None = None
        self._cluster_id: str | None = None
        #: Seconds from launching the JVM until the admin client got an answer (last start).
        self.ready_seconds: float | None = None
        #: Version the broker logged at start (falls back to the pinned jar version).
        self.broker_version: str | None = None

    # ---- properties -----------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The client (PLAINTEXT) port; raises ``BrokerError`` before ``start``."""
        if self._port is None:
            raise BrokerError("broker not started")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:PORT`` for clients."""
        return f"{HOST}:{self.port}"

    @property
    def run_dir(self) -> Path:
        """The folder with server.properties, logs/ and data/ (exists between start and stop)."""
        if self._run_dir is None:
            raise BrokerError("broker not started")
        return self._run_dir

    @property
    def log_file(self) -> Path:
        """The broker's log4j2 file log (WARN and above, plus the version banner)."""
        return self.run_dir / "logs" / "server.log"

    def cpu_seconds(self) -> float | None:
        """CPU seconds (user + system) the broker's JVM has used so far; None when not running or the
        platform has no `/proc` (benchmarks read it around a run)."""
        if self._proc is None:
            return None
        try:
            stat = Path(f"/proc/{self._proc.pid}/stat").read_text()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may contain spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def is_running(self) -> bool:
        """True while the JVM process is alive."""
        return self._proc is not None and self._proc.poll() is None

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Fetch jars if needed, then format (first start only), launch and wait until ready.

        Blocking, bounded by ``ready_timeout_s`` per attempt. Retries with fresh ports when a port was
        taken (unless ``port`` was fixed). Raises ``BrokerError`` on failure (the process is cleaned up).
        """
        if self.is_running():
            raise BrokerError("broker already running")
        jars = ensure_kafka_jars(self.version)
        if self._run_dir is None:
            if self._data_dir_arg is not None:
                self._data_dir_arg.mkdir(parents=True, exist_ok=True)
                self._run_dir = self._data_dir_arg
            else:
                self._run_dir = Path(tempfile.mkdtemp(prefix="clef-kafka-"))
        _LIVE.add(self)
        last: BrokerError | None = None
        for attempt in range(1, self._start_attempts + 1):
            if self._port is None:
                self._port = self._fixed_port or free_port()
            if self._controller_port is None:
                self._controller_port = free_port()
            try:
                self._write_config()
                self._format(jars)
                self._launch(jars)
                return
            except PortInUseError as exc:
                last = exc
                _log.warning("kafka_port_in_use", attempt=attempt, port=self._port)
                self._kill()
                self._controller_port = None  # pick fresh ports (the client port only if not fixed)
                if self._fixed_port is None:
                    self._port = None
            except BaseException:
                self._kill()
                raise
        raise last or BrokerError("broker did not start")

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after ``stop_timeout_s``) and remove temporary data.

        Idempotent; never raises for an already stopped broker.
        """
        self._terminate()
        if self._run_dir is not None and not self._keep_data:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None
        _LIVE.discard(self)

    def restart(self, *, hard: bool = False) -> None:
        """Stop the JVM (``hard``: SIGKILL at once) and start it again on the same ports and data."""
        if hard:
            self._kill()
        else:
            self._terminate()
        self.start()

    def __enter__(self) -> LocalKafka:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ---- topics ---------------------------------------------------------------------------------
    def create_topics(
        self,
        names: Iterable[str],
        *,
        partitions: int = 1,
        config: dict[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        """Create topics (replication 1) and wait until every partition has a leader.

        An existing topic is not an error. Blocking, bounded by ``timeout_s``; raises ``BrokerError``.
        """
        wanted = [n for n in names if n]
        if wanted:
            run_coroutine(self._create_topics(wanted, partitions, config or {}, timeout_s), timeout_s + 5)

    async def _create_topics(
        self, names: list[str], partitions: int, config: dict[str, str], timeout_s: float
    ) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        deadline = time.monotonic() + timeout_s
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers, request_timeout_ms=10_000)
        await admin.start()
        try:
            topics = [NewTopic(n, partitions, 1, topic_configs=config) for n in names]
            response = await admin.create_topics(topics, timeout_ms=int(timeout_s * 1000))
            for entry in response.topic_errors:
                name, code = entry[0], entry[1]
                if code not in (0, 36):  # 36 = TOPIC_ALREADY_EXISTS
                    raise BrokerError(f"creating topic {name!r} failed with error code {code}")
            while time.monotonic() < deadline:
                described = await admin.describe_topics(names)
                if len(described) == len(names) and all(
                    t["error_code"] == 0
                    and t["partitions"]
                    and all(p["leader"] >= 0 for p in t["partitions"])
                    for t in described
                ):
                    return
                await asyncio.sleep(0.1)
            raise BrokerError(f"topics {names} got no leaders within {timeout_s:.0f} s")
        finally:
            await admin.close()

    # ---- internals ------------------------------------------------------------------------------
    def _write_config(self) -> None:
        run = self.run_dir
        (run / "logs").mkdir(parents=True, exist_ok=True)
        (run / "data").mkdir(parents=True, exist_ok=True)
        extra = self._extra_listeners
        listeners = [f"PLAINTEXT://{HOST}:{self._port}", f"CONTROLLER://{HOST}:{self._controller_port}"]
        listeners += [f"{x.name}://{HOST}:{x.port}" for x in extra]
        advertised = [f"PLAINTEXT://{HOST}:{self._port}"]
        advertised += [f"{x.name}://{HOST}:{x.advertised_port or x.port}" for x in extra]
        protocols = [
            "PLAINTEXT:PLAINTEXT",
            "CONTROLLER:PLAINTEXT",
            *(f"{x.name}:{x.protocol}" for x in extra),
        ]
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{HOST}:{self._controller_port}",
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": ",".join(protocols),
            "log.dirs": str(run / "data"),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "num.network.threads": "2",
            "num.io.threads": "2",
            "log.flush.interval.messages": "9223372036854775807",
            **self._extra_properties,
        }
        text = "".join(f"{k}={v}\n" for k, v in props.items())
        (run / "server.properties").write_text(text, encoding="utf-8")
        log4j = [
            "status = error",
            "name = clef-local-kafka",
            "appender.file.type = File",
            "appender.file.name = FILE",
            f"appender.file.fileName = {run / 'logs' / 'server.log'}",
            "appender.file.layout.type = PatternLayout",
            "appender.file.layout.pattern = [%d] %p %m (%c)%n",
            "rootLogger.level = WARN",
            "rootLogger.appenderRef.file.ref = FILE",
            "logger.appinfo.name = org.apache.kafka.common.utils.AppInfoParser",
            "logger.appinfo.level = INFO",
            # the class moved to an internals package in Kafka 4.4
            "logger.appinfo2.name = org.apache.kafka.common.utils.internals.AppInfoParser",
            "logger.appinfo2.level = INFO",
            "logger.started.name = kafka.server.KafkaRaftServer",
            "logger.started.level = INFO",
        ]
        (run / "log4j2.properties").write_text("\n".join(log4j) + "\n", encoding="utf-8")

    def _java(self) -> str:
        java = shutil.which("java")
        if java is None:
            raise BrokerError("Java ('java', 17 or newer) is not installed")
        return java

    def _format(self, jars: Path) -> None:
        run = self.run_dir
        if (run / "data" / "meta.properties").is_file():
            return  # formatted on an earlier start: keep the data
        if self._cluster_id is None:
            self._cluster_id = new_cluster_id()
        cmd = [
            self._java(), "-Xmx256m", "-XX:-UsePerfData",  # no /tmp/hsperfdata_<user> files
            f"-Dlog4j2.configurationFile={run / 'log4j2.properties'}",
            "-cp", f"{jars}/*", "kafka.tools.StorageTool", "format",
            "-t", self._cluster_id, "-c", str(run / "server.properties"), *self._format_args,
        ]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        except subprocess.TimeoutExpired as exc:
            raise BrokerError("formatting the broker storage timed out") from exc
        if proc.returncode != 0:
            tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
            raise BrokerError(f"formatting the broker storage failed: {tail}")

    def _launch(self, jars: Path) -> None:
        run = self.run_dir
        cmd = [
            self._java(), f"-Xms{min(512, self._heap_mb)}m", f"-Xmx{self._heap_mb}m",
            "-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true", "-XX:-UsePerfData",
            f"-Dlog4j2.configurationFile={run / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={run / 'logs'}",
            "-cp", f"{jars}/*", "kafka.Kafka", str(run / "server.properties"),
        ]  # fmt: skip
        out = (run / "logs" / "jvm.out").open("ab")
        began = time.monotonic()
        try:
            # own session: a Ctrl-C in the terminal reaches us, and we stop the broker in order
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            out.close()
        self._wait_ready(began)
        self.ready_seconds = time.monotonic() - began
        self.broker_version = self._logged_version() or self.version
        _log.info(
            "kafka_ready",
            bootstrap=self.bootstrap_servers,
            version=self.broker_version,
            ready_seconds=round(self.ready_seconds, 2),
        )

    def _wait_ready(self, began: float) -> None:
        deadline = began + self._ready_timeout_s
        while True:
            if self._proc is None or self._proc.poll() is not None:
                self._raise_exited()
            if self._port_open() and self._admin_answers():
                return
            if time.monotonic() >= deadline:
                raise BrokerError(
                    f"broker not ready within {self._ready_timeout_s:.0f} s; log: {self.log_file}"
                )
            time.sleep(0.2)

    def _port_open(self) -> bool:
        try:
            with socket.create_connection((HOST, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _admin_answers(self) -> bool:
        async def probe() -> bool:
            from aiokafka.admin import AIOKafkaAdminClient

            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers, request_timeout_ms=3_000)
            try:
                await asyncio.wait_for(admin.start(), 5)
                info = await asyncio.wait_for(admin.describe_cluster(), 5)
                return bool(info.get("brokers"))
            except Exception:
                return False
            finally:
                with contextlib.suppress(Exception):
                    await admin.close()

        try:
            return run_coroutine(probe(), 15)
        except Exception:
            return False

    def _raise_exited(self) -> None:
        code = self._proc.returncode if self._proc is not None else None
        text = ""
        for name in ("server.log", "jvm.out"):
            path = self.run_dir / "logs" / name
            if path.is_file():
                text += path.read_text(encoding="utf-8", errors="replace")[-20_000:]
        self._proc = None
        if "Address already in use" in text or "BindException" in text:
            raise PortInUseError(f"broker exited (code {code}): address already in use")
        lines = [ln for ln in text.splitlines() if "ERROR" in ln or "Exception" in ln][-2:]
        raise BrokerError(
            f"broker exited with code {code}: {' | '.join(lines) or 'see ' + str(self.log_file)}"
        )

    def _logged_version(self) -> str | None:
        try:
            text = self.log_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        found = _VERSION_RE.findall(text)
        return found[-1] if found else None

    def _terminate(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=self._stop_timeout_s)
            except subprocess.TimeoutExpired:
                _log.warning("kafka_stop_timeout", seconds=self._stop_timeout_s)
                self._kill()
                return
        self._proc = None

    def _kill(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self._proc = None


@atexit.register
def _stop_leftovers() -> None:
    """Never leave a JVM behind when the interpreter exits without calling ``stop``."""
    for broker in list(_LIVE):
        with contextlib.suppress(Exception):
            broker.stop()
