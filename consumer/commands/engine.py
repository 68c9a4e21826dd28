"""``clef-router make-tiny-release`` and ``clef-router decide``: the engine from the command line.

``decide REQUEST.json --model DIR`` prints the SystemOne response JSON on stdout (exit 0); for an invalid
request it prints the error body (``{"detail": ...}``, SPEC section 2) on stderr and exits 2 (a file that is
not JSON, or a missing release directory, fails before the model loads); an engine failure's error body
also goes to stderr (exit 1).
``decide --batch FILE.jsonl --model DIR`` reads one request per non-blank line, decides them as GPU
batches and writes one response or error body per line, in input order. One request's failure is that
request's error line; every other line is still answered.

Every request is validated before the model loads: when no line is valid the model is never loaded.
Exit codes: 0 when every request was answered; 1 when the engine failed on any request (an
``engine_failed``/``oom_single_record`` error line, HTTP status 500); otherwise 2 when any request was
invalid (a 4xx error line). An unreadable input file is a usage error (2, one line on stderr); a release
that cannot be loaded exits 1. Loading progress and logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from consumer.commands import Commands, UsageError
from engine.batching.cut import API_LIMITS

if TYPE_CHECKING:
    from schemas.systemone import RequestError, SystemOneRequest, SystemOneResponse


def register(commands: Commands) -> None:
    """Add ``make-tiny-release`` and ``decide``."""
    tiny = commands.add_parser(
        "make-tiny-release", help="Write a tiny random-weight Clef-omni release (real layout) into DIR"
    )
    tiny.add_argument("dir", metavar="DIR", type=Path, help="output directory (created if needed)")
    tiny.add_argument("--seed", type=int, default=0, help="random seed; same seed, same bytes (default 0)")
    tiny.add_argument(
        "--layout",
        choices=("per-expert", "fused"),
        default="per-expert",
        help="MoE experts one tensor per expert (the published layout, default) or fused per layer",
    )
    tiny.set_defaults(func=_make_tiny_release)

    decide = commands.add_parser("decide", help="Answer SystemOne requests with a Clef release")
    decide.add_argument("request", metavar="REQUEST.json", nargs="?", type=Path, help="one request body")
    decide.add_argument("--model", required=True, type=Path, metavar="DIR", help="release directory")
    decide.add_argument("--batch", type=Path, metavar="FILE.jsonl", help="one request per line instead")
    decide.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    decide.add_argument(
        "--dtype", choices=("float32", "bfloat16"), help="default: bfloat16 on cuda, else float32"
    )
    decide.add_argument(
        "--max-batch-tokens",
        type=int,
        default=API_LIMITS.max_tokens,
        help="token budget per forward pass (default: the Python API's)",
    )
    decide.add_argument(
        "--max-batch-records",
        type=int,
        default=API_LIMITS.max_records,
        help="records per forward pass (default: the Python API's)",
    )
    decide.add_argument(
        "--confidence-formula", choices=("typesafe", "top"), default="typesafe", help="confidence definition"
    )
    decide.add_argument(
        "--no-truncate-state",
        dest="truncate_state",
        action="store_false",
        help="reject over-long states (400 context_length_exceeded) instead of cutting their tail",
    )
    decide.set_defaults(func=_decide)


def _make_tiny_release(args: argparse.Namespace) -> int:
    from consumer.commands.checkout import require_dev_package

    require_dev_package("devtools", "clef-router make-tiny-release")
    from devtools.tiny_release import write_tiny_release

    path = write_tiny_release(args.dir, seed=args.seed, layout=args.layout)
    for item in path.rglob("*"):  # safetensors writes 0600; a container's other uid must read the release
        item.chmod(0o755 if item.is_dir() else 0o644)
    print(str(path))
    return 0


def _result_line(result: SystemOneResponse | RequestError) -> str:
    from schemas.systemone import RequestError

    if isinstance(result, RequestError):
        return json.dumps(result.body(), ensure_ascii=False)
    return result.model_dump_json()


def _read_inputs(args: argparse.Namespace) -> list[bytes]:
    path: Path = args.batch if args.batch is not None else args.request
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    if args.batch is not None:
        return [line for line in data.splitlines() if line.strip()]
    return [data]


def _exit_code(results: list[SystemOneResponse | RequestError]) -> int:
    from schemas.systemone import RequestError

    statuses = [r.status for r in results if isinstance(r, RequestError)]
    if any(status >= 500 for status in statuses):
        return 1
    return 2 if statuses else 0


def _decide(args: argparse.Namespace) -> int:
    if (args.request is None) == (args.batch is None):
        raise UsageError("give exactly one of REQUEST.json or --batch FILE.jsonl")
    if args.max_batch_tokens <= 0 or args.max_batch_records <= 0:
        raise UsageError("--max-batch-tokens and --max-batch-records must be positive")
    inputs = _read_inputs(args)

    from schemas.systemone import RequestError, parse_request

    # Validate first: a bad line is answered without waiting for (or ever paying for) the model load.
    results: list[SystemOneResponse | RequestError | None] = []
    valid: list[tuple[int, SystemOneRequest]] = []
    for index, raw in enumerate(inputs):
        try:
            valid.append((index, parse_request(raw)))
            results.append(None)
        except RequestError as error:
            results.append(error)
    if valid:
        for (index, _), result in zip(valid, _run_engine(args, [r for _, r in valid]), strict=True):
            results[index] = result
    done = [r for r in results if r is not None]
    assert len(done) == len(inputs), "every input line gets a result"
    # one request: an error body goes to stderr (stdout is for answers); --batch keeps input order on stdout
    out = sys.stderr if args.batch is None and isinstance(done[0], RequestError) else sys.stdout
    for result in done:
        out.write(_result_line(result) + "\n")
    out.flush()
    return _exit_code(done)


def _run_engine(
    args: argparse.Namespace, requests: list[SystemOneRequest]
) -> list[SystemOneResponse | RequestError]:
    """Load the release and decide the validated `requests` (blocking); results in input order."""
    if not args.model.is_dir():
        raise UsageError(f"--model {args.model} is not a directory (a Clef-omni release)")
    from consumer.engine_config import engine_config
    from consumer.settings import BatchingSettings, EngineSettings
    from engine.device import cuda_available
    from engine.runner import Engine

    device = args.device or ("cuda" if cuda_available() else "cpu")
    if device == "cuda" and not cuda_available():
        raise UsageError("--device cuda: no CUDA device is available")
    settings = EngineSettings(
        model_path=args.model,
        device=device,
        dtype=args.dtype or ("bfloat16" if device == "cuda" else "float32"),
        truncate_state=args.truncate_state,
        confidence_formula=args.confidence_formula,
    )
    batching = BatchingSettings(
        max_batch_tokens=args.max_batch_tokens, max_batch_records=args.max_batch_records
    )
    config = engine_config(settings, batching)
    engine = Engine.from_release(args.model, config=config)
    return engine.decide(requests)
