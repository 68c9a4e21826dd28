"""Typed hand-offs between the engine stages (encode -> batch -> model -> answers).

Plain frozen dataclasses: the encoder produces an `EncodedRequest` on a CPU thread, the GPU worker
collates several of them into one forward pass, and the model returns per-option probabilities in
`schemas.systemone.option_table` order for every question of every record.

`ServingEngine` is the one protocol a server (the Kafka consumer, the HTTP service) drives the engine
through; `engine.runner.Engine` satisfies it, and so do `devtools.stub.StubEngine` and test stand-ins. This
module imports no torch at import time, so a server can name the protocol without loading torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from engine.batching.cut import BatchLimits

if TYPE_CHECKING:
    import torch
    from _typeshed import DataclassInstance

    from schemas.systemone import SystemOneRequest, SystemOneResponse

_D = TypeVar("_D", bound="DataclassInstance")

# Question type ids, as the joint head's type embedding expects them (SPEC section 4).
TYPE_NOUL = 0
TYPE_CHOICE = 1
TYPE_SCORE = 2

Span = tuple[int, int]
"""Half-open token range [start, end) inside one record's input_ids."""


@dataclass(frozen=True, slots=True)
class EncodedRequest:
    """One request encoded exactly as SPEC section 5 says.

    `question_spans[k]` is question k's instruction span (request order); `option_spans[k][j]` is option j
    of question k in `option_table` order. `media` holds processor outputs (tensors keyed by the names the
    Qwen3-Omni thinker takes, e.g. `pixel_values`, `image_grid_thw`, `input_features`) or is None for a
    text-only record. `media_span` is the half-open range of the media tokens M inside `input_ids` (None
    without media): only placeholders inside it are replaced by media features, so media tokens that a
    state happens to spell out stay plain text.
    """

    input_ids: tuple[int, ...]
    question_ids: tuple[str, ...]
    question_types: tuple[int, ...]
    question_spans: tuple[Span, ...]
    option_spans: tuple[tuple[Span, ...], ...]
    state_truncated: bool = False
    media: Mapping[str, Any] | None = field(default=None)
    media_span: Span | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


def map_tensor_fields(obj: _D, fn: Callable[[torch.Tensor], torch.Tensor]) -> _D:
    """A copy of dataclass `obj` with `fn` applied to every field holding a tensor (e.g. a device move)."""
    import torch

    # getattr by dataclass field name: the fields are only known through `dataclasses.fields`
    moved = {f.name: fn(v) for f in fields(obj) if isinstance(v := getattr(obj, f.name), torch.Tensor)}
    return replace(obj, **moved)


Between = Callable[[], None]
"""A hook a run calls on the GPU thread between two of its steps (decoder layers of a large batch, the
parts of a batch): it may run other GPU work there, e.g. an urgent small batch, and returns when done."""


class PreparedLike(Protocol):
    """What a server needs from a prepared record: its token count (what it costs in a batch)."""

    @property
    def num_tokens(self) -> int: ...


PreparedT = TypeVar("PreparedT", bound=PreparedLike)
StagedT = TypeVar("StagedT")
RanT = TypeVar("RanT")
_R_co = TypeVar("_R_co", covariant=True)


class Launched(Protocol[_R_co]):
    """A run whose device work is queued (`ServingEngine.launch`). `wait()` blocks until that work finished
    (any thread, once) and returns the run's result and the device seconds it took from its first to its
    last queued operation, or None where the engine does not time its device (then a caller times the
    wall clock). It re-raises what the device reported for the run."""

    def wait(self) -> tuple[_R_co, float | None]: ...


@dataclass(frozen=True, slots=True)
class Ready(Generic[RanT]):
    """A `Launched` run that already finished (an engine with no device queue)."""

    value: RanT

    def wait(self) -> tuple[RanT, float | None]:
        return self.value, None


class RunsWhenLaunched(Generic[StagedT, RanT]):
    """`ServingEngine.launch` for engines with no device queue (stubs, test stand-ins): the run happens
    inside `launch`, whose result is `Ready`. A subclass defines `run`."""

    def run(self, staged: StagedT, between: Between | None = None) -> RanT:
        raise NotImplementedError

    def launch(self, staged: StagedT, between: Between | None = None) -> Launched[RanT]:
        return Ready(self.run(staged, between))

    def queues_whole(self, staged: StagedT) -> bool:
        """False: `launch` runs the batch itself, nothing is queued."""
        return False


class ServingEngine(Protocol[PreparedT, StagedT, RanT]):
    """The engine as a server drives it: prepare -> stage -> run -> respond, plus failure handling.

    - `limits`: what one batch may hold; the server cuts its batches by these (`engine.batching.cut`).
    - `prepare` (CPU, any thread, thread-safe): validate and encode; raises `RequestError` (permanent).
    - `stage` (any thread): collate a batch and start its copy to the device.
    - `run` (the one GPU thread): the forward pass(es) of a staged batch; `between`, when given, is called
      on that thread between steps of the run (`Between`), so an urgent batch can run inside a long one
      without changing either's answers.
    - `launch` (the one GPU thread): `run` split in two: it queues the run's device work and returns a
      `Launched` whose `wait` (any thread) gives the result once the device finished. The next batch may be
      launched before an earlier one's `wait`: the device runs them in launch order, and the answers are
      those of `run`. `run(s, b)` is `launch(s, b).wait()[0]`.
    - `queues_whole(staged)`: True when `launch(staged)` queues all of the batch's device work without
      waiting on the device or calling `between` (CUDA graph replays and the head); only such a batch is
      worth launching behind one still running. An eager run paces its launches to the device and offers
      `between` boundaries; launched behind a running batch it would hold the GPU thread, and the urgent
      work at those boundaries, for that batch's remainder.
    - `respond` (any thread): one response per record, in batch order.
    - `execute(batch)` is `respond(run(stage(batch)))` in the GPU thread (the path a failed batch is split
      and retried on).
    - `out_of_memory(exc)`: True when `exc` is the device running out of memory; frees cached device
      memory first, so a retry of a smaller batch can fit. The server never inspects the exception itself.
    - `lane()`: a context for the urgent lane, entered on each thread that stages or runs an urgent batch
      (the stage and the run of one urgent batch both inside it): device work launched inside it goes to
      a lane of its own, so it does not queue behind the bulk work already launched (on CUDA a
      high-priority stream; a no-op context where there is nothing to queue behind).
    Every step but `prepare` may raise for a batch; the server then splits the batch and retries it.
    """

    @property
    def limits(self) -> BatchLimits: ...

    def prepare(self, request: SystemOneRequest) -> PreparedT: ...

    def stage(self, batch: Sequence[PreparedT]) -> StagedT: ...

    def run(self, staged: StagedT, between: Between | None = None) -> RanT: ...

    def launch(self, staged: StagedT, between: Between | None = None) -> Launched[RanT]: ...

    def queues_whole(self, staged: StagedT) -> bool: ...

    def respond(self, ran: RanT) -> list[SystemOneResponse]: ...

    def execute(self, batch: Sequence[PreparedT]) -> list[SystemOneResponse]: ...

    def out_of_memory(self, exc: BaseException) -> bool: ...

    def lane(self) -> AbstractContextManager[None]: ...
