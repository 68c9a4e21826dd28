"""Fetch the Apache Kafka broker jars from Maven Central into a cache outside the repository.

The broker used by the integration tests and by ``clef-router kafka-local`` is the real Apache Kafka
(single-node KRaft), run from the jars of ``org.apache.kafka:kafka_2.13`` plus the log4j2 binding that
Kafka's POM leaves out on purpose. Maven resolves the whole runtime closure from one throw-away POM.

Cache layout: ``${CLEF_CACHE_DIR:-~/.cache/clef-router}/kafka-<version>/`` holds every jar in one folder
and a ``COMPLETE`` marker. ``--with-tools`` (``tools=True``) fetches the broker plus Apache Kafka's command
line tools (``org.apache.kafka:kafka-tools``: topics, broker API versions) into ``kafka-<version>-tools/``,
for the compose smoke test's stand-in of the ``apache/kafka`` image. A fetch downloads into a temporary
sibling folder and renames it into place, so a half-finished download is never mistaken for a cache hit,
and two concurrent fetches cannot corrupt it.
Maven's own repository lives in that temporary folder too (``-Dmaven.repo.local``), so a fetch writes
nothing to ``~/.m2`` and nothing outside the cache root stays behind. While Maven runs, a progress line
(files and megabytes downloaded so far) goes to stderr every few seconds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TextIO

#: Pinned broker version (Maven ``org.apache.kafka:kafka_2.13``); docker-compose.yml uses the same image tag.
KAFKA_VERSION = "4.4.0"
#: Scala build of the broker artifact.
SCALA_VERSION = "2.13"
#: log4j2 version that Kafka 4.4's own POM pulls in; the slf4j 1.x binding must match it.
LOG4J_VERSION = "2.25.5"
#: Bound on one Maven run (a cold fetch of ~45 MB takes seconds to a minute here).
MAVEN_TIMEOUT_S = 900.0

_MARKER = "COMPLETE"
#: Seconds between two progress lines on stderr while Maven downloads.
PROGRESS_EVERY_S = 5.0
_DOWNLOADED = re.compile(r"Downloaded from \S+: \S+ \((\d+(?:\.\d+)?) (B|kB|MB)")
_UNIT = {"B": 1, "kB": 1e3, "MB": 1e6}


class KafkaFetchError(RuntimeError):
    """Maven is missing or could not resolve the broker jars."""


def cache_root() -> Path:
    """Return the cache root: ``$CLEF_CACHE_DIR`` if set, else ``~/.cache/clef-router``."""
    env = os.environ.get("CLEF_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "clef-router"


def jar_dir(version: str = KAFKA_VERSION, *, tools: bool = False) -> Path:
    """Return the folder where the jars of ``version`` (with the command line tools if ``tools``) live once
    fetched (it may not exist yet)."""
    return cache_root() / (f"kafka-{version}-tools" if tools else f"kafka-{version}")


def _needed_jars(version: str, tools: bool) -> list[str]:
    names = [f"kafka_{SCALA_VERSION}-{version}.jar"]
    return [*names, f"kafka-tools-{version}.jar"] if tools else names


def is_fetched(version: str = KAFKA_VERSION, *, tools: bool = False) -> bool:
    """True when the jars of ``version`` (and the tools if ``tools``) are completely present in the cache."""
    folder = jar_dir(version, tools=tools)
    return (folder / _MARKER).is_file() and all((folder / n).is_file() for n in _needed_jars(version, tools))


def _pom(version: str, log4j_version: str, tools: bool = False) -> str:
    deps = [
        ("org.apache.kafka", f"kafka_{SCALA_VERSION}", version),
        ("org.apache.logging.log4j", "log4j-api", log4j_version),
        ("org.apache.logging.log4j", "log4j-core", log4j_version),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", log4j_version),
    ]
    if tools:
        deps.append(("org.apache.kafka", "kafka-tools", version))
    body = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "  <modelVersion>4.0.0</modelVersion>\n"
        "  <groupId>local.clef-router</groupId><artifactId>kafka-broker-jars</artifactId>\n"
        "  <version>1</version><packaging>pom</packaging>\n"
        f"  <dependencies>\n{body}\n  </dependencies>\n"
        "</project>\n"
    )


def ensure_kafka_jars(
    version: str = KAFKA_VERSION,
    *,
    log4j_version: str = LOG4J_VERSION,
    timeout_s: float = MAVEN_TIMEOUT_S,
    tools: bool = False,
) -> Path:
    """Return the folder holding every broker jar of ``version`` (plus the command line tools' jars if
    ``tools``), fetching it with Maven if needed.

    Blocking (runs ``mvn``, bounded by ``timeout_s``). A cache hit returns at once without running Maven.
    Raises ``KafkaFetchError`` when ``mvn`` is not installed, fails or times out.
    """
    target = jar_dir(version, tools=tools)
    if is_fetched(version, tools=tools):
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaFetchError("Maven ('mvn') is not installed; install it (e.g. apt-get install maven)")
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".kafka-{version}-", dir=root))
    try:
        (work / "pom.xml").write_text(_pom(version, log4j_version, tools), encoding="utf-8")
        out = work / "jars"
        cmd = [
            mvn, "-B", "dependency:copy-dependencies",
            "-DincludeScope=runtime", f"-DoutputDirectory={out}", f"-Dmaven.repo.local={work / 'repository'}",
        ]  # fmt: skip
        print(
            f"fetching the Apache Kafka {version} broker jars (about 45 MB, once) with Maven into {target}",
            file=sys.stderr,
            flush=True,
        )
        _run_maven(cmd, work, timeout_s, sys.stderr)
        missing = [name for name in _needed_jars(version, tools) if not (out / name).is_file()]
        if missing:
            raise KafkaFetchError(f"mvn finished but {', '.join(missing)} is missing")
        (out / _MARKER).write_text(f"kafka {version}\nlog4j {log4j_version}\n", encoding="utf-8")
        if target.exists() and not is_fetched(version, tools=tools):
            shutil.rmtree(target)  # a leftover from an older layout or a manual copy
        try:
            out.rename(target)
        except OSError:
            if not is_fetched(version, tools=tools):  # not a concurrent fetch that won the race
                raise
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_maven(cmd: list[str], cwd: Path, timeout_s: float, progress: TextIO) -> None:
    """Run Maven (blocking, killed after `timeout_s`), printing a progress line to `progress` every
    `PROGRESS_EVERY_S` seconds. Raises `KafkaFetchError` when it fails or times out."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL
    )
    timer = threading.Timer(timeout_s, proc.kill)  # readline below blocks: the bound must be a thread
    timer.start()
    tail: list[str] = []
    files, size, began = 0, 0.0, time.monotonic()
    last = began
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = [*tail[-4:], line.strip()]
            found = _DOWNLOADED.search(line)
            if found:
                files += 1
                size += float(found.group(1)) * _UNIT[found.group(2)]
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY_S:
                last = now
                print(
                    f"  ... {files} files, {size / 1e6:.1f} MB downloaded ({now - began:.0f} s)",
                    file=progress,
                    flush=True,
                )
        code = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if time.monotonic() - began >= timeout_s:
        raise KafkaFetchError(f"mvn did not finish within {timeout_s:.0f} s")
    if code != 0:
        raise KafkaFetchError(f"mvn failed with exit {code}: {' | '.join(tail)}")
    print(f"  done: {files} files, {size / 1e6:.1f} MB in {time.monotonic() - began:.0f} s", file=progress)


def main(argv: list[str] | None = None) -> int:
    """``python -m devtools.kafka_jars [--with-tools]``: fetch the pinned jars and print their folder."""
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--with-tools"]):
        print("usage: python -m devtools.kafka_jars [--with-tools]", file=sys.stderr)
        return 2
    try:
        print(ensure_kafka_jars(tools=bool(args)))
    except KafkaFetchError as exc:
        print(f"kafka_jars: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
