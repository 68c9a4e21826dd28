"""The engine: prepare (CPU, any thread) -> execute (one GPU worker thread) -> SystemOne responses.

`Engine.prepare` validates media and encodes a request; `Engine.execute` runs one forward pass over a
batch of prepared records and builds their responses; `Engine.decide` strings both together for the
CLI, tests and the Python API. The Kafka consumer and HTTP server call `prepare`/`execute` directly.

`execute` is `respond(run(stage(batch)))`. A caller that streams batches can split it over threads so that
only GPU work stays on the GPU thread: `stage` (collate on the CPU, asynchronous copy to the device; any
thread) -> `run` (forward, head, one device-to-host copy; the GPU thread) -> `respond` (SystemOne answers;
any thread). Staging batch N+1 and answering batch N-1 then overlap batch N's forward.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Generic

import torch
from typing_extensions import TypeVar

from engine.batching.collate import Layout, launch_forward
from engine.batching.cut import BatchLimits, plan_batches
from engine.batching.split import EngineError, run_split
from engine.config import TORCH_DTYPES, DTypeName, EngineConfig, dtype_name
from engine.encoding.encode import TextEncoder, encoder_for
from engine.fast_path import enable as enable_fast_path
from engine.handoff import MediaHook, MediaInputLike, ModelLike, Prepared, RunResult, StagedBatch
from engine.lane import Lane
from engine.launch import DeviceSpan, LaunchedRun, Part
from engine.media import MediaError
from engine.model.clef import ClefOmniModel
from engine.types import Between, EncodedRequest
from schemas.systemone import (
    DlqReason,
    ProbabilityError,
    RequestError,
    SystemOneRequest,
    SystemOneResponse,
    build_response,
    parse_request,
)

# The engine's one entry: its config, dtype map and hand-offs live in `engine.config`/`engine.handoff` and
# are importable from here too.
__all__ = [
    "TORCH_DTYPES",
    "DTypeName",
    "Engine",
    "EngineConfig",
    "Prepared",
    "RunResult",
    "StagedBatch",
    "dtype_name",
]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=ModelLike, default=ClefOmniModel)


class Engine(Generic[M]):
    """One loaded model (a `ModelLike`: the Clef model, or a test's stand-in) plus its tokenizer; see the
    module docstring for the threading rules.

    `tokenizer` is the release tokenizer (or a processor carrying it as `.tokenizer`); `media_hook` decodes
    a request's media (None: text only, a request with media is a permanent 400). Satisfies
    `engine.types.ServingEngine`. Raises `ValueError` when the tokenizer lacks the special tokens of Clef's
    format.
    """

    def __init__(
        self,
        model: M,
        tokenizer: object,
        config: EngineConfig | None = None,
        *,
        media_hook: MediaHook | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config if config is not None else EngineConfig()
        self._encoder: TextEncoder = encoder_for(tokenizer)
        self._media_hook = media_hook
        self._graph_tokens = enable_fast_path(model, self.config).graph_tokens  # largest bucket, 0: none
        self._layout: Layout | None = None if self.config.layout == "auto" else self.config.layout
        self._lane = Lane(model.device, self.config.lane_stream)

    @classmethod
    def from_release(
        cls,
        path: str | Path,
        device: str | None = None,
        dtype: DTypeName | None = None,
        config: EngineConfig | None = None,
    ) -> Engine[ClefOmniModel]:
        """Load a release directory (blocking, seconds to minutes) and wrap it in an engine.

        `device`/`dtype` override the ones in `config`. The media hook decodes media under
        `config.media_limits`/`media_policy` with the release's processors; a release whose processor
        files cannot be read serves text only (logged). Raises whatever `load_release_model` raises
        for a missing or inconsistent release.
        """
        from dataclasses import replace

        from engine.media.expand import media_hook
        from engine.media.features import MediaProcessors
        from engine.model.release import load_release_model

        cfg = config if config is not None else EngineConfig()
        cfg = replace(cfg, device=device or cfg.device, dtype=dtype or cfg.dtype)
        loaded = load_release_model(path, device=cfg.device, dtype=cfg.torch_dtype)
        log.info("release loaded from %s: %s", path, ", ".join(f"{k} {v:.2f}s" for k, v in loaded.phases))
        hook: MediaHook | None = None
        try:
            processors = MediaProcessors.from_release(path)
            hook = media_hook(loaded.tokenizer, processors, cfg.media_limits, cfg.media_policy)
        except (OSError, KeyError, TypeError, ValueError) as exc:
            log.warning("media disabled for %s: %s", path, exc)
        return Engine(loaded.model, loaded.tokenizer, cfg, media_hook=hook)

    @property
    def limits(self) -> BatchLimits:
        """What one forward pass may hold (`EngineConfig.limits`), with the largest CUDA graph's tokens
        as `graph_tokens` (0 without graphs); a server's batcher cuts by these."""
        return self.config.limits.with_graph(self._graph_tokens)

    def _media(self, request: SystemOneRequest) -> MediaInputLike | None:
        """The one place a request's media is decoded (None for a text-only request).

        Without a `media_hook` (a release whose processors could not be read), or with the FP8 text-only
        experts (`EngineConfig.fp8_text_only`), a request with media is a permanent 400 error.
        """
        if not request.has_media:
            return None
        if self.model.text_only:  # the model's own state: also when a bench switched it after start
            message = "this engine runs FP8 text-only experts (engine.fp8_text_only): it takes no media"
            raise RequestError(DlqReason.media_undecodable, message, status=400)
        if self._media_hook is None:
            raise RequestError(DlqReason.media_undecodable, "this engine serves text only", status=400)
        try:
            return self._media_hook(request)
        except RequestError:
            raise
        except Exception as exc:  # a processor failure is still this request's media, never a 5xx
            log.warning("media hook failed unexpectedly", exc_info=True)
            message = f"cannot process media ({type(exc).__name__})"
            raise MediaError(DlqReason.media_undecodable, message) from exc

    def prepare(self, request: SystemOneRequest) -> Prepared:
        """Decode media and encode `request` (CPU only, thread-safe).

        Raises `RequestError` (permanent, with a reason code) for over-long input or bad media.
        """
        media = self._media(request)
        encoded = self._encoder.encode(
            request,
            media_tokens=media.token_ids if media is not None else None,
            media=media.tensors if media is not None else None,
            max_tokens=self.config.max_tokens,
            truncate_state=self.config.truncate_state,
        )
        return Prepared(request, encoded)

    def execute(self, batch: Sequence[Prepared]) -> list[SystemOneResponse]:
        """Run `batch` (one forward pass; more when the text fast path splits off media records or a
        right-padded group would exceed `limits.max_tokens`, see `stage`) and build a response per record,
        in batch order: `respond(run(stage(batch)))`.

        Call from one worker thread only. May raise `torch.OutOfMemoryError` (the caller splits the
        batch and retries the halves) or `ProbabilityError` when the model produced NaN/inf.
        """
        if not batch:
            return []
        return self.respond(self.run(self.stage(batch)))

    def stage(self, batch: Sequence[Prepared]) -> StagedBatch:
        """Collate `batch` on the CPU, one part per forward pass, and start the copies to the device
        (thread-safe, non-blocking). Parts: text and media records apart on the text fast path, and a
        right-padded group (media on a GPU with dense attention, or `layout="padded"`) cut so that records
        x longest fits `limits.max_tokens`.

        The copy is queued on the device's current stream, so it lands before any later `run`. Raises
        ValueError for an empty batch; may raise `torch.OutOfMemoryError`.
        """
        if not batch:
            raise ValueError("stage needs at least one record")
        encoded = [p.encoded for p in batch]
        parts = tuple(
            (group, self.model.collate([encoded[i] for i in group], layout=self._layout))
            for group in self._forward_groups(encoded)
        )
        return StagedBatch(tuple(batch), parts)

    def _forward_groups(self, encoded: Sequence[EncodedRequest]) -> list[tuple[int, ...]]:
        """Indexes into `encoded` per forward pass, each in batch order: text and media records apart when
        the text fast path is on, and a group that will be right-padded cut by `plan_batches` at its padded
        cost (records x longest within `limits`; the service's batcher cuts by the packed cost, the plain
        sum of tokens).

        A packed group that would need a dense attention mask runs one record per pass instead (see
        `_one_per_pass`): a single unpadded sequence needs no mask at all (sdpa's `is_causal`), so memory
        stays linear in its length, and each record's answer is exactly its answer alone."""
        media = [bool(e.media) for e in encoded]
        groups = [tuple(range(len(encoded)))]
        if any(media) and not all(media) and self.model.fast_path:
            groups = [
                tuple(i for i, m in enumerate(media) if not m),
                tuple(i for i, m in enumerate(media) if m),
            ]
        out: list[tuple[int, ...]] = []
        for group in groups:
            with_media = any(media[i] for i in group)
            layout = self._layout or self.model.layout_for(with_media)
            if len(group) > 1 and self._one_per_pass(layout, with_media):
                out += [(i,) for i in group]
                continue
            if len(group) == 1 or layout != "padded":
                out.append(group)
                continue
            plan = plan_batches([encoded[i].num_tokens for i in group], self.limits, "padded")
            out += [tuple(sorted(group[k] for k in part)) for part in plan]
        return out

    def _one_per_pass(self, layout: Layout, with_media: bool) -> bool:
        """True when several records packed in one row would make transformers build a dense attention
        mask: without varlen attention a packed row becomes a block-diagonal (T, T) mask over the whole
        pack (T^2 bools). This is the CPU's default layout. A right-padded group (dense attention on a GPU,
        or `layout="padded"`) keeps its (B, 1, L, L) mask, bounded by the token budget that `plan_batches`
        applies to it; a record that fills the budget runs alone and unpadded, with no mask."""
        return layout == "packed" and not self.model.can_pack(with_media)

    def run(self, staged: StagedBatch, between: Between | None = None) -> RunResult:
        """Forward pass(es), head and one device-to-host copy per part (blocking; the GPU thread only):
        `launch(staged, between).wait()[0]`. May raise `torch.OutOfMemoryError`."""
        return self.launch(staged, between).wait()[0]

    def launch(self, staged: StagedBatch, between: Between | None = None) -> LaunchedRun:
        """`run` with its device work queued only (the GPU thread only; `engine.launch`): the next batch may
        be launched before this one's `wait()`, which any thread may call once.

        `between` (see `engine.types.Between`) is called between parts and between the decoder layers of a
        part that runs them one by one. Inside the lane (`lane()`), the lane's stream first waits for the
        bulk work launched so far: a CUDA graph's buffers are shared by every batch of its bucket. May raise
        `torch.OutOfMemoryError`.
        """
        self._lane.follow_bulk()
        span = DeviceSpan(self.model.device)
        parts: list[Part] = []
        with torch.inference_mode():
            for k, (group, inputs) in enumerate(staged.parts):
                if between is not None and k:
                    between()
                parts.append((group, launch_forward(self.model, inputs, between)))
        self._lane.mark_bulk(span.close())
        return LaunchedRun(staged.prepared, parts, span)

    def queues_whole(self, staged: StagedBatch) -> bool:
        """True when `launch(staged)` queues all of the batch's device work at once (`ServingEngine`): one
        forward pass, replayed from CUDA graphs (`ClefOmniModel.queues_whole`). A batch of several parts
        calls `between` between them; an eager one paces its layers to the device."""
        return len(staged.parts) == 1 and self.model.queues_whole(staged.parts[0][1])

    def out_of_memory(self, exc: BaseException) -> bool:
        """True when `exc` is the device running out of memory (`torch.OutOfMemoryError`); empties the CUDA
        cache first, so a retry of a smaller batch can use the memory. Any thread."""
        if not isinstance(exc, torch.OutOfMemoryError):
            return False
        if self.config.device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.empty_cache()
        return True

    def lane(self) -> AbstractContextManager[None]:
        """The urgent lane (`engine.types.ServingEngine.lane`; `engine.lane`): enter it around both the
        `stage` and the `run` of an urgent batch, on each thread, never around a bulk batch's."""
        return self._lane.enter()

    def respond(self, result: RunResult) -> list[SystemOneResponse]:
        """SystemOne responses of a run batch, in batch order (CPU, any thread).

        Raises `ProbabilityError` when the model produced NaN, infinite or negative probabilities.
        """
        return [
            build_response(
                p.request,
                {qid: probs.tolist() for qid, probs in per_question.items()},
                input_tokens=p.num_tokens,
                state_truncated=p.encoded.state_truncated,
                confidence_formula=self.config.confidence_formula,
            )
            for p, per_question in zip(result.prepared, result.probabilities, strict=True)
        ]

    def decide(
        self, requests: Sequence[SystemOneRequest | Mapping[str, Any] | str | bytes]
    ) -> list[SystemOneResponse | RequestError]:
        """Validate, prepare, pack by token budget and execute `requests` (blocking).

        Results come back in input order: a `SystemOneResponse` per good request and a `RequestError` per
        failed one; one request's failure never affects the others. Client errors keep their 4xx reason;
        an unexpected failure while preparing or running a record becomes that record's `engine_failed`
        (500) error, after its batch has been split so that every other record is still answered.
        """
        results: list[SystemOneResponse | RequestError | None] = [None] * len(requests)
        ready: list[tuple[int, Prepared]] = []
        for index, raw in enumerate(requests):
            try:
                request = raw if isinstance(raw, SystemOneRequest) else parse_request(raw)
                ready.append((index, self.prepare(request)))
            except RequestError as error:
                results[index] = error
            except Exception as exc:  # a bug or library failure on this record must not sink the others
                log.warning("preparing request %d failed", index, exc_info=True)
                results[index] = _engine_failed("cannot prepare the request", exc)
        layout = self._layout or self.model.layout_for(False)
        plan = plan_batches([p.num_tokens for _, p in ready], self.limits, layout)
        for group in plan:
            batch = [ready[k] for k in group]
            split = run_split(
                self.execute,
                [p for _, p in batch],
                single_attempts=self.config.single_record_attempts,
                out_of_memory=self.out_of_memory,
            )
            for (index, _), outcome in zip(batch, split.outcomes, strict=True):
                results[index] = _request_error(outcome) if isinstance(outcome, EngineError) else outcome
        assert all(r is not None for r in results), "every request gets a result"
        return [r for r in results if r is not None]


def _request_error(error: EngineError) -> RequestError:
    """The `RequestError` `decide` gives a record the engine failed on even alone (its reason kept)."""
    cause = error.cause
    if error.reason == DlqReason.oom_single_record:
        return RequestError(DlqReason.oom_single_record, "out of GPU memory for this record alone")
    if isinstance(cause, ProbabilityError):
        return RequestError(DlqReason.engine_failed, f"model output unusable: {cause}")
    return _engine_failed("the model failed on this request", cause)


def _engine_failed(what: str, exc: BaseException) -> RequestError:
    """A 500 `engine_failed` error naming the exception type only (its message may quote the payload)."""
    return RequestError(DlqReason.engine_failed, f"{what} ({type(exc).__name__})")
