"""`python -m bench engine`: the whole engine path on the full-size Clef-omni thinker (one H200).

Builds the thinker (text MoE + vision and audio towers) and the joint head at full size with random bf16
weights directly on the GPU, then measures encode -> batch -> forward -> head -> answers on realistic
SystemOne requests (3 questions: choice with 4-8 options, score with 4 levels, noul), and in the same run
the plain transformers backbone forward on the same token batches as the baseline.
The tokenizer is the tiny release's (the real one cannot be downloaded here); encoding cost is of the
same order. Prints JSON lines and a table; writes `engine.jsonl`, `engine.md` and `throughput.png` to
`--out` (default `$OUT` or `bench-out/`). Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bench.fullsize import TEXT_CONFIG
from bench.report import Bench, write_outputs
from bench.timing import synced_ms
from bench.workload import build_engine, make_request
from engine.batching.cut import BatchLimits
from engine.runner import Engine, EngineConfig, Prepared, RunResult, StagedBatch
from engine.types import Between
from schemas.systemone import SystemOneRequest, SystemOneResponse

PEAK_TFLOPS = 790.0


def flops_per_token(context: int) -> float:
    """Forward FLOPs per token of the thinker text stack at a given record length (matmuls + attention)."""
    c = TEXT_CONFIG
    h, layers, d = c["hidden_size"], c["num_hidden_layers"], c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    attn_proj = h * (q + 2 * kv) + q * h
    experts = c["num_experts_per_tok"] * 3 * h * c["moe_intermediate_size"] + h * c["num_experts"]
    attn_scores = 2 * q * context / 2  # causal: on average half the context, QK and PV
    return float(2.0 * layers * (attn_proj + experts + attn_scores))


def stream(
    engine: Engine,
    requests: Sequence[SystemOneRequest],
    budget: int,
    max_records: int,
    timed_run: TimedRun | None = None,
) -> dict[str, float]:
    """Whole path, streamed the way the service runs it: one tokenizer thread (`Engine.prepare`) feeds
    batches filled to `budget`; each batch is staged (collate + copy) on this thread, run on one GPU
    thread (at most two batches queued there) and answered on a third thread, so staging and answers
    overlap the forward of the neighbouring batches.

    Returns `req_s` and `TimedRun.figures`, timed from the first request submitted to the last answer;
    `timed_run` (a fresh one by default) keeps each run's span for callers that want them.
    """
    timed_run = timed_run or TimedRun(engine)
    tokens = 0

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(1) as tokenizer, ThreadPoolExecutor(1) as gpu, ThreadPoolExecutor(1) as answers:
        futures = [tokenizer.submit(engine.prepare, r) for r in requests]
        running: deque[Future[RunResult]] = deque()
        answered: list[Future[list[SystemOneResponse]]] = []
        batch: list[Prepared] = []
        size = 0

        def flush() -> None:
            nonlocal batch, size
            if not batch:
                return
            staged = engine.stage(batch)
            while len(running) >= 2:
                running.popleft().result()
            ran = gpu.submit(timed_run, staged)
            running.append(ran)
            answered.append(answers.submit(_respond_when_run, engine, ran))
            batch, size = [], 0

        for f in futures:
            p = f.result()
            if batch and (size + p.num_tokens > budget or len(batch) >= max_records):
                flush()
            batch.append(p)
            size += p.num_tokens
            tokens += p.num_tokens
        flush()
        responses = sum(len(a.result()) for a in answered)
    end = time.perf_counter()
    assert responses == len(requests)
    return {"req_s": len(requests) / (end - t0), **timed_run.figures(tokens, t0, end)}


class TimedRun:
    """`Engine.run` for the GPU thread that records when each call ran and how many records it had, and
    the stream figures derived from that (`figures`)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.spans: list[tuple[float, float]] = []  # (start, end) of each call
        self.records: list[int] = []

    def __call__(self, staged: StagedBatch, between: Between | None = None) -> RunResult:
        t = time.perf_counter()
        result = self._engine.run(staged, between)
        self.spans.append((t, time.perf_counter()))
        self.records.append(len(staged.prepared))
        return result

    def figures(self, tokens: int, t0: float, end: float) -> dict[str, float]:
        """`tok_s` over `t0`..`end` (includes filling the first batch); `steady_tok_s` from the start of
        the first run, the sustained rate of a stream that never runs dry; `gpu_thread_busy` the share of
        that steady window spent in `Engine.run`; `batch_ms_*` the time per run."""
        steady = end - self.spans[0][0]
        run_ms = [(b - a) * 1000.0 for a, b in self.spans]
        return {
            "tokens": tokens,
            "seconds": end - t0,
            "tok_s": tokens / (end - t0),
            "steady_tok_s": tokens / steady,
            "gpu_thread_busy": sum(run_ms) / 1000.0 / steady,
            "batches": len(run_ms),
            "records_per_batch": statistics.mean(self.records),
            "batch_ms_p50": statistics.median(run_ms),
            "batch_ms_p99": max(run_ms) if len(run_ms) < 100 else statistics.quantiles(run_ms, n=100)[98],
        }


def _respond_when_run(engine: Engine, ran: Future[RunResult]) -> list[SystemOneResponse]:
    return engine.respond(ran.result())


def baseline(engine: Engine, requests: Sequence[SystemOneRequest], batch_size: int) -> dict[str, float]:
    """Plain transformers backbone (sdpa, default experts) on the same token batches, padded."""
    text_model: Any = engine.model.text_model
    encoded = [engine.prepare(r).encoded for r in requests]
    times: list[float] = []
    tokens = 0
    with torch.inference_mode():
        for start in range(0, len(encoded), batch_size):
            group = encoded[start : start + batch_size]
            longest = max(e.num_tokens for e in group)
            ids = torch.zeros(len(group), longest, dtype=torch.long)
            mask = torch.zeros(len(group), longest, dtype=torch.long)
            for i, e in enumerate(group):
                ids[i, : e.num_tokens] = torch.tensor(e.input_ids)
                mask[i, : e.num_tokens] = 1
            ids, mask = ids.cuda(), mask.cuda()
            text_model(input_ids=ids, attention_mask=mask)  # warm this shape
            times.append(synced_ms(partial(text_model, input_ids=ids, attention_mask=mask)))
            tokens += sum(e.num_tokens for e in group)
    seconds = sum(times) / 1000.0
    return {"tokens": tokens, "tok_s": tokens / seconds, "batch_ms_p50": statistics.median(times)}


def timings(fn: Callable[[], object], reps: int) -> dict[str, float]:
    """p50 / p99 / min milliseconds of `fn` over `reps` synchronised calls, after five warm-up calls."""
    for _ in range(5):
        fn()
    ms = sorted(synced_ms(fn) for _ in range(reps))
    return {
        "ms_p50": statistics.median(ms),
        "ms_p99": ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))],
        "ms_min": ms[0],
    }


def latency(engine: Engine, request: SystemOneRequest, reps: int) -> dict[str, float]:
    """`timings` of `Engine.decide` for one request."""
    return timings(lambda: engine.decide([request]), reps)


def run_info(build_started: float) -> dict[str, Any]:
    """The `info` row of a GPU bench: date, versions, GPU, engine build seconds since `build_started`
    (a `time.perf_counter()` value) and the weights' device memory."""
    import transformers

    return {
        "kind": "info",
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(),
        "build_s": round(time.perf_counter() - build_started, 1),
        "weights_gb": round(torch.cuda.memory_allocated() / 1e9, 1),
    }


def _append(sink: list[Any], fn: Callable[..., Any], *args: Any) -> None:
    sink.append(fn(*args))


def _head_to_host(head: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    return head(*args).float().cpu()


def head_share(engine: Engine, requests: Sequence[SystemOneRequest]) -> dict[str, float]:
    """Split one batch's execute time into backbone, head and answer building."""
    from schemas.systemone import build_response

    model: Any = engine.model
    prepared = [engine.prepare(r) for r in requests]
    out: dict[str, list[float]] = {"collate": [], "backbone": [], "head": [], "answers": []}
    for _ in range(4):
        with torch.inference_mode():
            t = time.perf_counter()
            batch = model.collate([p.encoded for p in prepared])
            torch.cuda.synchronize()
            out["collate"].append((time.perf_counter() - t) * 1000)
            hidden: list[torch.Tensor] = []
            out["backbone"].append(synced_ms(partial(_append, hidden, model.hidden_states, batch)))
            flat: list[Any] = []
            head_in = (hidden[0], model.lexical_table(), batch.index)
            out["head"].append(synced_ms(partial(_append, flat, _head_to_host, model.head, *head_in)))
            t = time.perf_counter()
            offset = 0
            for p, counts, qids in zip(prepared, batch.options_per_question, batch.question_ids, strict=True):
                probs = {}
                for qid, n in zip(qids, counts, strict=True):
                    probs[qid] = flat[0][offset : offset + n].numpy().tolist()
                    offset += n
                build_response(p.request, probs, input_tokens=p.num_tokens)
            out["answers"].append((time.perf_counter() - t) * 1000)
    med = {k: statistics.median(v[1:]) for k, v in out.items()}
    total = sum(med.values())
    return {
        **{f"{k}_ms": round(v, 2) for k, v in med.items()},
        "head_and_answers_share": round((med["head"] + med["answers"]) / total, 4),
    }


def invariance(engine: Engine, requests: Sequence[SystemOneRequest]) -> float:
    """Max |dp| between each request decided alone and all of them decided together."""
    together = engine.decide(list(requests))
    worst = 0.0
    for request, joint in zip(requests, together, strict=True):
        alone = engine.decide([request])[0]
        for qid, answer in joint.answers.items():  # type: ignore[union-attr]
            a, b = alone.answers[qid], answer  # type: ignore[union-attr]
            pa = a.probabilities if hasattr(a, "probabilities") else {"t": a.noul}
            pb = b.probabilities if hasattr(b, "probabilities") else {"t": b.noul}
            worst = max(worst, max(abs(pa[k] - pb[k]) for k in pb))
    return worst


def main(out_dir: str | None = None, quick: bool = False) -> int:
    """Run every measurement; returns 0. Needs CUDA."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench engine needs a CUDA GPU (run it on the H200)")
    out = Path(out_dir or os.environ.get("OUT") or "bench-out")
    out.mkdir(parents=True, exist_ok=True)

    from engine.model.graphs import default_buckets

    # Built without graphs first, to measure the eager fast path; graphs are captured further down.
    config = EngineConfig(device="cuda", dtype="bfloat16", limits=BatchLimits(65536, 256), graph_buckets=())
    t0 = time.perf_counter()
    # random routers: the plain transformers baseline of the same run ignores router biases
    engine = build_engine(config, routing="random")
    b = Bench(engine, out, [])
    b.emit(**run_info(t0))
    rng = random.Random(0)
    n512 = 128 if quick else 1024
    reqs512 = [make_request(rng, engine, 512) for _ in range(n512)]
    one = make_request(rng, engine, 800)
    lat = latency(engine, one, 15)
    b.emit(
        kind="latency",
        workload="one 800-token request, no CUDA graph",
        **{k: round(v, 2) for k, v in lat.items()},
    )
    t0 = time.perf_counter()
    engine.model.enable_fast_path(graph_buckets=default_buckets(config.limits.max_tokens))
    b.emit(
        kind="info",
        what="cuda graphs captured",
        seconds=round(time.perf_counter() - t0, 1),
        buckets=list(default_buckets(config.limits.max_tokens)),
    )
    stream(engine, reqs512[:64], 32768, 256)  # warm-up: first launches of every kernel

    budgets = (4096, 8192, 16384, 32768, 65536, 131072)
    sweep = []
    measured: list[int] = []
    for budget in budgets:
        torch.cuda.reset_peak_memory_stats()
        try:
            r = stream(engine, reqs512, budget, 256)
        except torch.OutOfMemoryError as exc:  # report it and go on with the other measurements
            b.emit(kind="error", workload="512-token requests", budget=budget, error=str(exc)[:300])
            torch.cuda.empty_cache()
            continue
        measured.append(budget)
        r["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
        sweep.append(r)
        b.emit(
            kind="throughput",
            workload="512-token requests",
            budget=budget,
            tok_s=round(r["tok_s"]),
            steady_tok_s=round(r["steady_tok_s"]),
            gpu_thread_busy=round(r["gpu_thread_busy"], 3),
            req_s=round(r["req_s"], 1),
            batch_ms_p50=round(r["batch_ms_p50"], 1),
            batch_ms_p99=round(r["batch_ms_p99"], 1),
            peak_gb=round(r["peak_gb"], 1),
            mfu=round(r["tok_s"] * flops_per_token(512) / 1e12 / PEAK_TFLOPS, 3),
        )
    for budget in (32768, 65536, 131072):
        prepared = [engine.prepare(r) for r in reqs512]
        ms = []
        try:
            for start in range(0, len(prepared), budget // 512):
                group = prepared[start : start + budget // 512]
                ms.append(synced_ms(partial(engine.execute, group)))
        except torch.OutOfMemoryError as exc:
            b.emit(kind="error", workload="pre-tokenized", budget=budget, error=str(exc)[:300])
            torch.cuda.empty_cache()
            continue
        tok = sum(p.num_tokens for p in prepared)
        b.emit(
            kind="throughput",
            workload="512-token requests, pre-tokenized (execute only)",
            budget=budget,
            tok_s=round(tok / sum(ms) * 1000),
            batch_ms_p50=round(statistics.median(ms), 1),
        )
    base = baseline(engine, reqs512[:128], 64)
    b.emit(
        kind="baseline",
        workload="512-token requests",
        batch=64,
        tok_s=round(base["tok_s"]),
        batch_ms_p50=round(base["batch_ms_p50"], 1),
        mfu=round(base["tok_s"] * flops_per_token(512) / 1e12 / PEAK_TFLOPS, 3),
    )

    mixed = [make_request(rng, engine, rng.randint(450, 3000)) for _ in range(64 if quick else 128)]
    r = stream(engine, mixed, 32768, 256)
    b.emit(
        kind="throughput",
        workload="mixed 450-3000 tokens",
        budget=32768,
        tok_s=round(r["tok_s"]),
        steady_tok_s=round(r["steady_tok_s"]),
        req_s=round(r["req_s"], 1),
        batch_ms_p50=round(r["batch_ms_p50"], 1),
        batch_ms_p99=round(r["batch_ms_p99"], 1),
    )
    base = baseline(engine, sorted(mixed, key=lambda q: len(json.dumps(q.state))), 16)
    b.emit(
        kind="baseline",
        workload="mixed 450-3000 tokens",
        batch=16,
        tok_s=round(base["tok_s"]),
        batch_ms_p50=round(base["batch_ms_p50"], 1),
    )

    lat = latency(engine, one, 30)
    b.emit(kind="latency", workload="one 800-token request", **{k: round(v, 2) for k, v in lat.items()})
    base = baseline(engine, [one] * 5, 1)
    b.emit(
        kind="baseline",
        workload="one 800-token request",
        batch=1,
        batch_ms_p50=round(base["batch_ms_p50"], 2),
    )

    b.emit(kind="head_share", workload="64 x 512", **head_share(engine, reqs512[:64]))
    b.emit(
        kind="invariance",
        workload="6 mixed requests, bf16 full size",
        max_abs_dp=invariance(engine, [make_request(rng, engine, n) for n in (150, 900, 400, 2500, 60, 700)]),
    )
    write_outputs(b, measured, sweep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
