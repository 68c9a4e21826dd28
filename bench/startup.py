"""`python -m bench.startup`: how fast a replica is ready, from a full-size release on disk.

Subcommands (each prints JSON lines; `all` runs them in order and writes them under `--out`):
    write   --release DIR     write the full-size random release, published layout (`bench.release_writer`)
    load    --release DIR     in this process: load the release onto the GPU (`engine.model.release`), phases,
    GB/s,
                              peak host RSS and GPU memory; `--legacy` reads it the way the old loader did
                              (one tensor at a time with `safe_open` into pageable memory, then a copy)
    serve   --release DIR     process start of `clef-router serve` to `/readyz` 200 and to the first answer,
                              with the service's own start-up lines as a timeline (seconds since spawn)
    engine  --release DIR     the engine bench's stream and one-request rows, engine from the release vs built
                              on the GPU (same process)
    restart --release DIR     `clef-router run` against a local broker with a backlog; kill -9 mid-stream,
                              start it again, and time until decisions flow again; the ledger (sent, decided,
                              lost, duplicates) at the end
The service runs in a child process (`bench.service_main`: PyAV placeholder where PyAV is missing), with its
Triton cache in a folder of the bench's own (`--triton-cache`), so the first start is cold and later ones
warm, as a replica restarting on the same node.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.startup_service import restart_run, serve_run


def emit(record: dict[str, Any], out: Path | None = None) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if out is not None:
        with (out / "startup.jsonl").open("a", encoding="utf-8") as f:
            f.write(line + "\n")


def write_cmd(args: argparse.Namespace) -> dict[str, Any]:
    from bench.release_writer import write_fullsize_release

    written = write_fullsize_release(args.release, log=lambda line: print(line, file=sys.stderr, flush=True))
    return {
        "what": "write",
        "path": str(written.path),
        "shards": written.shards,
        "tensors": written.tensors,
        "thinker_gb": round(written.thinker_bytes / 1e9, 2),
        "total_gb": round(written.total_bytes / 1e9, 2),
        "seconds": round(written.seconds, 1),
    }


def _legacy_read(release: Path) -> tuple[float, int]:
    """The old loader's way (main 9357298): per shard `safe_open`, then per tensor `get_tensor` (a pageable
    host copy) and `copy_` into its GPU parameter. Returns (seconds, bytes)."""
    import torch
    from safetensors import safe_open

    from engine.model.release import (
        plan_thinker_reads,
        read_config,
        read_weight_map,
        shard_headers,
        thinker_targets,
    )
    from engine.model.thinker import build_thinker

    config = read_config(release)
    thinker = build_thinker(config.thinker_config, "cuda", torch.bfloat16)  # parameters on meta
    targets = thinker_targets(thinker)
    pieces = plan_thinker_reads(targets, read_weight_map(release), shard_headers(release))
    state = {t.key: torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in targets.values()}
    start = time.monotonic()
    nbytes = 0
    with torch.no_grad():
        for shard in sorted({p.shard for p in pieces}):
            with safe_open(str(release / shard), framework="pt") as f:
                for p in (q for q in pieces if q.shard == shard):
                    tensor = f.get_tensor(p.name)
                    nbytes += tensor.numel() * tensor.element_size()
                    state[p.target].view(-1)[p.start : p.start + p.count].copy_(tensor.view(-1))
    torch.cuda.synchronize()
    return time.monotonic() - start, nbytes


def load_cmd(args: argparse.Namespace) -> dict[str, Any]:
    import logging

    import torch

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(message)s")
    release = Path(args.release)
    record: dict[str, Any] = {"what": "load", "loader": "legacy" if args.legacy else "engine.model.release"}
    if args.legacy:
        seconds, nbytes = _legacy_read(release)
        record.update(
            read_s=round(seconds, 2),
            read_gb=round(nbytes / 1e9, 2),
            gb_per_s=round(nbytes / 1e9 / seconds, 2),
        )
    else:
        from engine.model.release import load_release_model
        from engine.model.release_read import ReadOptions

        switch = None if args.switch_ms is None or args.switch_ms <= 0 else args.switch_ms / 1e3
        options = ReadOptions(workers=args.workers, chunk_bytes=args.chunk_mb << 20, switch_interval_s=switch)
        loaded = load_release_model(
            release, device="cuda", load_processor=False, read_options=options, early_read=not args.no_early
        )
        assert loaded.read is not None
        record.update(
            phases_s={k: round(v, 3) for k, v in loaded.phases},
            read_s=round(loaded.read.seconds, 3),
            read_gb=round(loaded.read.bytes / 1e9, 2),
            gb_per_s=round(loaded.read.gb_per_s, 2),
            workers=loaded.read.workers,
            early_read=not args.no_early,
            switch_ms=args.switch_ms,
            chunk_mb=args.chunk_mb,
            shards={s.shard: [round(s.bytes / 1e9, 2), round(s.seconds, 2)] for s in loaded.read.shards},
        )
    record.update(
        peak_rss_gb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9, 2),
        peak_gpu_gb=round(torch.cuda.max_memory_allocated() / 1e9, 2),
        torch=torch.__version__,
    )
    return record


def engine_cmd(args: argparse.Namespace) -> dict[str, Any]:
    """The engine bench's two headline rows (512-token stream at budget 65,536; one 800-token request) on
    the engine loaded from the release and on `bench.workload`'s engine built on the GPU, in this process
    one after the other: loading from disk must not change the speed."""
    import gc
    import random

    import torch

    from bench.engine import latency, stream
    from bench.workload import build_engine, make_request
    from engine.batching.cut import BatchLimits
    from engine.runner import Engine, EngineConfig

    config = EngineConfig(device="cuda", dtype="bfloat16", limits=BatchLimits(65_536, 256))
    rows: dict[str, Any] = {}
    for name in ("release", "gpu_random", "release_again"):
        engine = (
            Engine.from_release(args.release, config=config) if name != "gpu_random" else build_engine(config)
        )
        rng = random.Random(0)
        reqs = [make_request(rng, engine, 512) for _ in range(384)]
        one = make_request(rng, engine, 800)
        stream(engine, reqs[:64], 32_768, 256)  # warm-up
        tput = stream(engine, reqs, 65_536, 256)
        rows[name] = {
            "stream_tok_s": round(tput.get("tok_s", 0.0)),
            "stream": {k: round(v, 2) for k, v in tput.items()},
            "one_800_ms": {k: round(v, 2) for k, v in latency(engine, one, 20).items()},
        }
        print(json.dumps({name: rows[name]}), file=sys.stderr, flush=True)
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    return {"what": "engine", **rows}


def storage(path: Path) -> str:
    """The filesystem type holding `path` (from /proc/mounts: the longest mount point that contains it)."""
    best, kind = "", "unknown"
    resolved = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and resolved.startswith(parts[1]) and len(parts[1]) > len(best):
            best, kind = parts[1], parts[2]
    return f"{kind} at {best}"


def main(argv: Sequence[str] | None = None, prog: str = "python -m bench.startup") -> int:
    """Parse `argv` and run one step (see the module docstring); returns 0."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("write", "load", "serve", "restart", "engine"))
    p.add_argument("--release", type=Path, required=True, help="release directory")
    p.add_argument("--out", type=Path, help="append the JSON lines to OUT/startup.jsonl")
    p.add_argument("--legacy", action="store_true", help="load: the old one-tensor-at-a-time read")
    p.add_argument("--workers", type=int, default=16, help="load: reader threads")
    p.add_argument("--chunk-mb", type=int, default=64, help="load: buffer size per read")
    p.add_argument("--no-early", action="store_true", help="load: read after the model is built")
    p.add_argument(
        "--switch-ms", type=float, default=0.2, help="load: thread switch interval during the read (0: leave)"
    )
    p.add_argument("--triton-cache", type=Path, help="serve/restart: TRITON_CACHE_DIR of the service")
    p.add_argument(
        "--device", default="cuda", choices=("cuda", "cpu"), help="serve/restart: the engine's device"
    )
    p.add_argument(
        "--site",
        type=Path,
        help="serve/restart: run the service with `python -S` on this `bench.closure_site` folder (only the "
        "product's dependencies importable) instead of the interpreter's site-packages",
    )
    p.add_argument("--session-timeout-ms", type=int, help="restart: the service's kafka.session_timeout_ms")
    p.add_argument("--label", default="", help="a label copied into the output record")
    p.add_argument(
        "--backlog", type=int, default=3000, help="restart: events queued before the service starts"
    )
    p.add_argument("--timeout-s", type=float, default=300.0, help="serve/restart: give up after this long")
    args = p.parse_args(argv)
    from bench.av_placeholder import install_av_placeholder

    install_av_placeholder()  # the engine imports PyAV; the H200 machine has none (no media here)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    commands = {
        "write": write_cmd,
        "load": load_cmd,
        "serve": serve_run,
        "restart": restart_run,
        "engine": engine_cmd,
    }
    record = commands[args.what](args)
    record.update(label=args.label, storage=storage(args.release) if args.release.exists() else "")
    emit(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
