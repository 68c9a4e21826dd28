"""Read planned pieces (`engine.model.release_plan`) from the shards straight into the installed parameters.

Worker threads each own `depth` host buffers of `chunk_bytes` (page-locked when the targets are on CUDA) and
one CUDA stream. A worker takes the next chunk (a run of pieces whose bytes are contiguous in one shard),
waits until that buffer's previous copies have finished, reads the whole run with one `preadv` (which
releases the GIL), and queues one asynchronous host-to-device copy per piece into its slice of the target
(cast on the device when the stored dtype differs). Reads of one buffer overlap the copies of the other, and
the workers read different parts of the shards at once. Host memory stays at `workers x depth x chunk_bytes`
whatever the model's size; no tensor is ever materialised on the host as a whole. Bytes outside the pieces
(talker/code2wav tensors) are never read: a chunk never spans a gap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import resource
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.model.release_plan import Piece

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """`workers` reading threads, each with `depth` buffers of `chunk_bytes` (pinned for CUDA targets).

    The default is 16 threads, capped at the CPUs this process may use (BENCHMARKS.md, "Release loading",
    compares 8 and 16)."""

    workers: int = field(default_factory=lambda: max(1, min(16, len(os.sched_getaffinity(0)))))
    chunk_bytes: int = 64 << 20
    depth: int = 2
    switch_interval_s: float | None = 0.0002
    """The interpreter's thread switch interval while a read overlaps the model's build
    (`sys.setswitchinterval`; None leaves it): each piece's copy takes the GIL back, and at the default
    5 ms a reader waits that long for a thread that is importing modules."""


@dataclass(frozen=True, slots=True)
class ShardRead:
    """One shard: `bytes` read into `pieces` targets, finished `seconds` after the read began."""

    shard: str
    pieces: int
    bytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class ReadStats:
    """The whole read: bytes, wall seconds (copies finished), per-shard figures, peak host RSS so far."""

    bytes: int
    seconds: float
    shards: tuple[ShardRead, ...]
    workers: int
    peak_rss_bytes: int

    @property
    def gb_per_s(self) -> float:
        return self.bytes / 1e9 / max(self.seconds, 1e-9)


@dataclass(frozen=True, slots=True)
class _Chunk:
    shard: str
    begin: int  # file byte offset of the first piece
    end: int  # one past the last piece's last byte
    pieces: tuple[Piece, ...]


def _split(piece: Piece, limit: int) -> Iterator[Piece]:
    """`piece` cut into runs of at most `limit` bytes (whole elements)."""
    itemsize = piece.dtype.itemsize
    step = max(limit // max(itemsize, 1), 1)
    for first in range(0, piece.count, step):
        n = min(step, piece.count - first)
        yield Piece(
            piece.shard,
            piece.name,
            piece.offset + first * itemsize,
            n,
            piece.dtype,
            piece.target,
            piece.start + first,
        )


def chunks(pieces: Sequence[Piece], limit: int) -> list[_Chunk]:
    """Group `pieces` (sorted by shard and offset) into runs of contiguous bytes of at most `limit` bytes.

    A run breaks at a gap in the file, at a shard boundary, and where a piece would start at an offset in
    the buffer that is not a multiple of its element size (so the buffer can be viewed as that dtype)."""
    out: list[_Chunk] = []
    run: list[Piece] = []

    def flush() -> None:
        if run:
            out.append(_Chunk(run[0].shard, run[0].offset, run[-1].offset + run[-1].nbytes, tuple(run)))
            run.clear()

    for whole in pieces:
        for piece in _split(whole, limit):
            itemsize = piece.dtype.itemsize
            if run and (
                piece.shard != run[0].shard
                or piece.offset != run[-1].offset + run[-1].nbytes
                or piece.offset + piece.nbytes - run[0].offset > limit
                or (piece.offset - run[0].offset) % max(itemsize, 1)
            ):
                flush()
            run.append(piece)
    flush()
    return out


@dataclass
class _Progress:
    """Per-shard byte counts, written by the workers under `lock`; logs a line as each shard completes."""

    totals: dict[str, int]
    counts: dict[str, int]
    start: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    finished: dict[str, float] = field(default_factory=dict)

    def add(self, chunk: _Chunk) -> None:
        with self.lock:
            self.done[chunk.shard] += chunk.end - chunk.begin
            if self.done[chunk.shard] < self.totals[chunk.shard]:
                return
            seconds = time.monotonic() - self.start
            self.finished[chunk.shard] = seconds
            order = sorted(self.totals)
            log.info(
                "read shard %d/%d %s: %d pieces, %.2f GB, done at %.2fs (%.1f GB/s overall)",
                order.index(chunk.shard) + 1,
                len(order),
                chunk.shard,
                self.counts[chunk.shard],
                self.totals[chunk.shard] / 1e9,
                seconds,
                sum(self.done.values()) / 1e9 / max(seconds, 1e-9),
            )


def _read_exactly(fd: int, view: memoryview, offset: int, shard: str) -> None:
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n <= 0:
            raise OSError(f"{shard}: file ends at byte {offset + got}, expected {len(view) - got} more")
        got += n


def _worker(
    work: queue.SimpleQueue[_Chunk | None],
    targets: Mapping[str, torch.Tensor],
    root: Path,
    options: ReadOptions,
    buffer_bytes: int,
    device: torch.device,
    progress: _Progress,
    failed: threading.Event,
) -> None:
    cuda = device.type == "cuda"
    buffers = [torch.empty(buffer_bytes, dtype=torch.uint8, pin_memory=cuda) for _ in range(options.depth)]
    events: list[torch.cuda.Event | None] = [None] * options.depth
    stream = torch.cuda.Stream(device) if cuda else None  # type: ignore[no-untyped-call]
    fds: dict[str, int] = {}
    turn = 0
    try:
        while (chunk := work.get()) is not None and not failed.is_set():
            buffer, pending = buffers[turn], events[turn]
            if pending is not None:
                pending.synchronize()  # the copies out of this buffer have finished
            fd = fds.get(chunk.shard)
            if fd is None:
                fd = fds[chunk.shard] = os.open(root / chunk.shard, os.O_RDONLY)
            _read_exactly(
                fd, memoryview(buffer.numpy().data)[: chunk.end - chunk.begin], chunk.begin, chunk.shard
            )
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                for p in chunk.pieces:
                    first = p.offset - chunk.begin
                    src = buffer[first : first + p.nbytes].view(p.dtype)
                    dst = targets[p.target].view(-1)[p.start : p.start + p.count]
                    if cuda and src.dtype != dst.dtype:
                        src = src.to(device, non_blocking=True)  # cast on the device, same stream
                    dst.copy_(src, non_blocking=cuda)
                if stream is not None:
                    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    event.record(stream)
                    events[turn] = event
            progress.add(chunk)
            turn = (turn + 1) % options.depth
        for last in events:
            if last is not None:
                last.synchronize()
    except BaseException:
        failed.set()  # the other workers stop at their next chunk
        raise
    finally:
        for fd in fds.values():
            os.close(fd)


def read_pieces(
    targets: Mapping[str, torch.Tensor],
    pieces: Sequence[Piece],
    root: Path,
    options: ReadOptions | None = None,
) -> ReadStats:
    """Fill `targets` (installed key -> contiguous tensor, all on one device) from `pieces` (blocking).

    Raises `OSError` when a shard cannot be opened or ends early; the first worker error is raised after
    every worker has stopped. Logs one line per completed shard with the overall GB/s.
    """
    options = options or ReadOptions()
    if not pieces:
        return ReadStats(0, 0.0, (), 0, _peak_rss())
    device = next(iter(targets.values())).device
    for key in {p.target for p in pieces}:
        if not targets[key].is_contiguous():
            raise ValueError(f"{key}: target is not contiguous")
    work_list = chunks(pieces, options.chunk_bytes)
    totals: dict[str, int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    for c in work_list:
        totals[c.shard] += c.end - c.begin
    for p in pieces:
        counts[p.shard] += 1
    workers = max(1, min(options.workers, len(work_list)))
    work: queue.SimpleQueue[_Chunk | None] = queue.SimpleQueue()
    for c in work_list:
        work.put(c)
    for _ in range(workers):
        work.put(None)
    buffer_bytes = max(c.end - c.begin for c in work_list)
    failed = threading.Event()
    start = time.monotonic()
    progress = _Progress(dict(totals), dict(counts), start)
    with ThreadPoolExecutor(workers, thread_name_prefix="clef-release-read") as pool:
        futures = [
            pool.submit(_worker, work, targets, root, options, buffer_bytes, device, progress, failed)
            for _ in range(workers)
        ]
        errors = [f.exception() for f in futures]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.monotonic() - start
    shards = tuple(
        ShardRead(s, counts[s], totals[s], progress.finished.get(s, seconds)) for s in sorted(totals)
    )
    return ReadStats(sum(totals.values()), seconds, shards, workers, _peak_rss())


def _peak_rss() -> int:
    """This process's peak resident set so far, in bytes (Linux reports kilobytes)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
