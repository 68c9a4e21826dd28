"""`engine.batching.split.run_split`: the one rule that splits a failed batch until every record is answered
or
isolated (the service's batcher and `Engine.decide` both use it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.batching.split import EngineError, run_split
from schemas.errors import DlqReason


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError."""


def oom_check(hooks: list[int]) -> Callable[[BaseException], bool]:
    """An engine's `out_of_memory`: True for `OutOfMemoryError` (and counts the calls that said so)."""

    def out_of_memory(exc: BaseException) -> bool:
        if isinstance(exc, OutOfMemoryError):
            hooks.append(1)
            return True
        return False

    return out_of_memory


def test_single_oom_record_goes_to_dlq_and_the_rest_are_answered() -> None:
    calls: list[list[int]] = []

    def execute(batch: Sequence[int]) -> list[int]:
        calls.append(list(batch))
        if 3 in batch:
            raise OutOfMemoryError("CUDA out of memory")
        return [x * 10 for x in batch]

    oom_hooks: list[int] = []
    result = run_split(execute, [1, 2, 3, 4, 5], single_attempts=1, out_of_memory=oom_check(oom_hooks))
    outcomes = result.outcomes
    assert outcomes[:2] == [10, 20]
    assert outcomes[3:] == [40, 50]
    failure = outcomes[2]
    assert isinstance(failure, EngineError)
    assert failure.reason == DlqReason.oom_single_record
    assert result.stats.splits >= 2
    assert result.stats.ooms == len(oom_hooks)


def test_a_failure_reported_by_the_caller_starts_the_splitting() -> None:
    calls: list[list[int]] = []

    def execute(batch: Sequence[int]) -> list[int]:
        calls.append(list(batch))
        return [x * 10 for x in batch]

    oom_hooks: list[int] = []
    failed = OutOfMemoryError("CUDA out of memory")
    result = run_split(execute, [1, 2, 3, 4], out_of_memory=oom_check(oom_hooks), failed=failed)
    assert result.outcomes == [10, 20, 30, 40]
    assert calls == [[1, 2], [3, 4]], "the whole batch is not run again"
    assert (result.stats.calls, result.stats.splits, result.stats.ooms) == (3, 1, 1)
    assert oom_hooks == [1]
    alone = run_split(execute, [7], single_attempts=1, failed=ValueError("nan"))
    assert isinstance(alone.outcomes[0], EngineError)
    assert alone.outcomes[0].reason == DlqReason.engine_failed


def test_wrong_result_count_is_treated_as_failure() -> None:
    result = run_split(lambda batch: [0], [1, 2], single_attempts=1)
    assert result.outcomes == [0, 0]  # each half answered alone


def test_only_the_engine_says_what_is_out_of_memory() -> None:
    result = run_split(_raise(RuntimeError("CUDA out of memory. Tried to allocate")), [1], single_attempts=1)
    failure = result.outcomes[0]
    assert isinstance(failure, EngineError)
    assert failure.reason == DlqReason.engine_failed  # no message sniffing: the default check says no
    assert result.stats.ooms == 0


def _raise(exc: Exception) -> Callable[[Sequence[int]], list[int]]:
    def execute(batch: Sequence[int]) -> list[int]:
        raise exc

    return execute
