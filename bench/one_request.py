"""Where one 800-token request's wall time goes on the H200: `Engine.decide` split into its stages.

`python3 -m bench.one_request --out DIR` builds the full-size engine as `bench.experts` does (random bf16
weights, fast path, CUDA graphs up to 4,096 tokens, routers levelled to near-uniform expert load) and
times, for one 800-token request, 30 times each (after warm-up), with CUDA synchronisation:

- `decide`: the whole call, as `bench.engine.latency` measures it;
- `prepare` (validation and encoding, CPU), `stage` (collate and the copy to the GPU), `run` (graph
  replay, head, copy back) and `respond` (answers, CPU);
- inside `run`: the decoder alone (`hidden_states`) and the head alone on its output.

Prints JSON lines (p50/p99/min per stage) and writes `one_request.jsonl` to `--out`, and Python's
profile of `--reps` `decide` calls (cumulative time) to `profile_decide.txt`. Not a test.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.engine import timings
from bench.report import emit_line as emit


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []

    from bench.experts import biased_engine, level
    from bench.workload import make_request

    engine, biases, _ = biased_engine()
    rng = random.Random(0)
    probe = [engine.prepare(make_request(rng, engine, 512)).encoded for _ in range(16)]
    with torch.inference_mode():
        level(engine, biases, engine.model.collate(probe))
    one = make_request(random.Random(1), engine, 800)
    prepared = engine.prepare(one)
    staged = engine.stage([prepared])
    result = engine.run(staged)
    model: Any = engine.model
    batch = model.collate([prepared.encoded])
    emit(rows, kind="request", tokens=prepared.num_tokens)
    box: dict[str, torch.Tensor] = {}

    def decoder() -> None:
        with torch.inference_mode():
            box["h"] = model.hidden_states(batch)

    def head() -> None:
        with torch.inference_mode():
            model.head(box["h"], model.lexical_table(), batch.index).float().cpu()

    stages: dict[str, Callable[[], object]] = {
        "decide": lambda: engine.decide([one]),
        "prepare": lambda: engine.prepare(one),
        "stage": lambda: engine.stage([prepared]),
        "run": lambda: engine.run(staged),
        "respond": lambda: engine.respond(result),
        "decoder": decoder,
        "head": head,
    }
    for name, fn in stages.items():
        emit(rows, kind="stage", stage=name, **{k: round(v, 2) for k, v in timings(fn, args.reps).items()})
    (out / "one_request.jsonl").write_text("\n".join(rows) + "\n")
    # Where `decide`'s host time goes beyond its stages: Python's profiler over `reps` calls.
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [engine.decide([one]) for _ in range(args.reps)])
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(45)
    (out / "profile_decide.txt").write_text(text.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
