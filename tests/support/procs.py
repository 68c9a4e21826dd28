"""Which processes a test started are still alive: each run sets a marker variable in its environment, which
every descendant inherits (also those in a session of their own, like a broker's JVM)."""

from __future__ import annotations

from pathlib import Path


def marked_processes(variable: str, value: str) -> list[str]:
    """`pid: command line` of every process whose environment holds `variable=value` (read from /proc)."""
    needle = f"{variable}={value}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                found.append(f"{proc.name}: {(proc / 'cmdline').read_bytes()[:120]!r}")
        except OSError:  # gone meanwhile, or a kernel thread
            continue
    return found
