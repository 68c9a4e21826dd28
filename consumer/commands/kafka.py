"""``clef-router kafka-local``: a real single-node Apache Kafka broker on 127.0.0.1, in the foreground.

The client port defaults to 9092, the default of every other command (``CLEF_KAFKA__BOOTSTRAP_SERVERS``);
``--port 0`` picks a free one. stdout contract: the first line is ``bootstrap=127.0.0.1:PORT``, printed once
the broker answers an admin client and the requested topics exist; then ``kafka_version=...``,
``ready_seconds=...`` and ``data_dir=...`` lines. stderr gets the ``export CLEF_KAFKA__BOOTSTRAP_SERVERS=...``
line to paste into another shell. SIGINT or SIGTERM stops the broker cleanly (exit 0); its data is removed
unless ``--data-dir`` was given. If the broker dies on its own the command exits 1; a taken port exits 2.
"""

from __future__ import annotations

import argparse
import errno
import signal
import socket
import sys
import threading
from types import FrameType

from consumer.commands import CommandError, Commands, UsageError

_POLL_S = 0.5
#: The client default (`KafkaSettings.bootstrap_servers` is 127.0.0.1:9092): a broker started without
#: --port is found by every other command without configuration.
DEFAULT_PORT = 9092


def register(commands: Commands) -> None:
    """Add ``kafka-local``."""
    p = commands.add_parser(
        "kafka-local",
        help="Run a local Apache Kafka broker (KRaft, single node) in the foreground",
    )
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"client port on 127.0.0.1 (default {DEFAULT_PORT}, the other commands' default; 0: a free one)",
    )
    p.add_argument(
        "--data-dir", default=None, help="keep the broker's data in this folder (default: temporary, removed)"
    )
    p.add_argument("--topics", default="", help="comma-separated topics to create once ready")
    p.add_argument("--partitions", type=int, default=1, help="partitions per created topic (default 1)")
    p.add_argument(
        "--fetch-only",
        action="store_true",
        help="only fetch the broker jars into the cache and print the folder",
    )
    p.set_defaults(func=_kafka_local)


def _kafka_local(args: argparse.Namespace) -> int:
    from consumer.commands.checkout import require_dev_package

    require_dev_package("devtools", "clef-router kafka-local")
    from devtools.kafka_jars import KafkaFetchError, ensure_kafka_jars
    from devtools.kafka_local import BrokerError, LocalKafka

    if args.fetch_only:
        try:
            print(ensure_kafka_jars(), flush=True)
        except KafkaFetchError as exc:
            raise CommandError(str(exc)) from exc
        return 0
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {args.port}")
    if args.port and not _port_free(args.port):
        raise UsageError(
            f"port {args.port} on 127.0.0.1 is in use (another broker?); pass --port 0 for a free one"
        )
    if args.partitions < 1:
        raise UsageError("--partitions must be at least 1")
    topics = [t.strip() for t in args.topics.split(",") if t.strip()]

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    broker = LocalKafka(port=args.port or None, data_dir=args.data_dir)
    try:
        try:
            broker.start()
            if stop.is_set():
                return 0
            broker.create_topics(topics, partitions=args.partitions)
        except (BrokerError, KafkaFetchError) as exc:
            raise CommandError(str(exc)) from exc
        print(f"bootstrap={broker.bootstrap_servers}", flush=True)
        print(f"kafka_version={broker.broker_version}", flush=True)
        print(f"ready_seconds={broker.ready_seconds:.2f}", flush=True)
        print(f"data_dir={broker.run_dir}", flush=True)
        hint = f"export CLEF_KAFKA__BOOTSTRAP_SERVERS={broker.bootstrap_servers}"
        print(f"kafka-local: ready (Ctrl-C stops it); other shells: {hint}", file=sys.stderr, flush=True)
        while not stop.wait(_POLL_S):
            if not broker.is_running():
                raise CommandError(f"the broker exited unexpectedly; log: {broker.log_file}")
        print("stopping", file=sys.stderr, flush=True)
        return 0
    finally:
        broker.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _port_free(port: int) -> bool:
    """True when 127.0.0.1:`port` can be bound now (checked before the JVM starts, for a clear error)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True
