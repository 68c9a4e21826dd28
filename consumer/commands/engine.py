"""``clef-router make-tiny-release`` and ``clef-router decide``: the engine from the command line.

``decide REQUEST.json --model DIR`` prints the SystemOne response JSON on stdout (exit 0); for an invalid
request it prints the error body (``{"detail": ...}``, SPEC section 2) on stderr and exits 2 (a file that is
not JSON, or a missing release directory, fails before the model loads).
``decide --batch FILE.jsonl --model DIR`` reads one request per non-blank line, decides them as GPU
batches and writes one response or error body per line, in input order; it exits 2 when any line was
invalid (every line is still answered), else 0. Loading progress and logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from consumer.commands import Commands, UsageError

if TYPE_CHECKING:
    from schemas.systemone import RequestError, SystemOneResponse


def register(commands: Commands) -> None:
    """Add ``make-tiny-release`` and ``decide``."""
    tiny = commands.add_parser(
        "make-tiny-release", help="Write a tiny random-weight Clef-omni release (real layout) into DIR"
    )
    tiny.add_argument("dir", metavar="DIR", type=Path, help="output directory (created if needed)")
    tiny.add_argument("--seed", type=int, default=0, help="random seed; same seed, same bytes (default 0)")
    tiny.set_defaults(func=_make_tiny_release)

    decide = commands.add_parser("decide", help="Answer SystemOne requests with a Clef release")
    decide.add_argument("request", metavar="REQUEST.json", nargs="?", type=Path, help="one request body")
    decide.add_argument("--model", required=True, type=Path, metavar="DIR", help="release directory")
    decide.add_argument("--batch", type=Path, metavar="FILE.jsonl", help="one request per line instead")
    decide.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    decide.add_argument(
        "--dtype", choices=("float32", "bfloat16"), help="default: bfloat16 on cuda, else float32"
    )
    decide.add_argument("--max-batch-tokens", type=int, default=65_536, help="token budget per forward pass")
    decide.add_argument("--max-batch-records", type=int, default=64, help="records per forward pass")
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
    from engine.tiny import write_tiny_release

    path = write_tiny_release(args.dir, seed=args.seed)
    for item in path.rglob("*"):  # safetensors writes 0600; a container's other uid must read the release
        item.chmod(0o755 if item.is_dir() else 0o644)
    print(str(path))
    return 0


def _result_line(result: SystemOneResponse | RequestError) -> str:
    from schemas.systemone import RequestError

    if isinstance(result, RequestError):
        return json.dumps(result.body(), ensure_ascii=False)
    return result.model_dump_json()


def _decide(args: argparse.Namespace) -> int:
    if (args.request is None) == (args.batch is None):
        raise UsageError("give exactly one of REQUEST.json or --batch FILE.jsonl")
    if args.max_batch_tokens <= 0 or args.max_batch_records <= 0:
        raise UsageError("--max-batch-tokens and --max-batch-records must be positive")
    if args.batch is not None:
        lines = [line for line in args.batch.read_bytes().splitlines() if line.strip()]
        inputs: list[bytes] = lines
    else:
        inputs = [args.request.read_bytes()]
        from schemas.parse import parse_request
        from schemas.systemone import RequestError as _RequestError

        try:  # before the model loads (seconds to minutes): a bad request fails at once
            parse_request(inputs[0])
        except _RequestError as error:
            print(_result_line(error), file=sys.stderr)
            return 2
    if not args.model.is_dir():
        raise UsageError(f"--model {args.model} is not a directory (a Clef-omni release)")

    import torch

    from engine.runner import DTypeName, Engine, EngineConfig
    from schemas.systemone import RequestError

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    dtype: DTypeName = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    config = EngineConfig(
        device=device,
        dtype=dtype,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_records=args.max_batch_records,
        truncate_state=args.truncate_state,
        confidence_formula=args.confidence_formula,
    )
    engine = Engine.from_release(args.model, config=config)
    decide_inputs: list[Any] = list(inputs)
    results = engine.decide(decide_inputs)
    # one request: an error body goes to stderr (stdout is for answers); --batch keeps input order on stdout
    out = sys.stderr if args.batch is None and isinstance(results[0], RequestError) else sys.stdout
    for result in results:
        out.write(_result_line(result) + "\n")
    out.flush()
    return 2 if any(isinstance(r, RequestError) for r in results) else 0
