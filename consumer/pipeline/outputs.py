"""Outcomes -> output records: the router for answers, the dead-letter builder for failures (pure but for
metrics and the DLQ guard; event loop only)."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from datetime import UTC, datetime

from consumer.logging import get_logger
from consumer.metrics import Metrics
from consumer.pipeline.dlq import DlqGuard, dead_letter
from consumer.pipeline.router import Router
from consumer.records import InputRecord, Outcome, OutRecord
from consumer.settings import Settings
from engine.batching.split import EngineError
from schemas.dead_letter import DlqStage, stage_for
from schemas.errors import DlqReason, RequestError
from schemas.routing import EngineInfo, datetime_json, engine_json

log = get_logger("consumer.pipeline.outputs")


def _version() -> str:
    try:
        return importlib.metadata.version("clef-router")
    except importlib.metadata.PackageNotFoundError:
        return ""


def default_engine_info(model_name: str) -> EngineInfo:
    """The `engine` member of decisions when the caller gives none: this package, its version, the model."""
    return EngineInfo(name="clef-router", version=_version(), model=model_name)


class Outputs:
    """Builds the output records of a unit's outcomes; an answered record becomes its decisions and route
    records (`consumer.pipeline.router`), a failed one a DLQ record (`consumer.pipeline.dlq`) once the DLQ
    guard agrees."""

    def __init__(self, settings: Settings, metrics: Metrics, engine_info: EngineInfo) -> None:
        self._dlq_topic = settings.topics.dlq
        self._metrics = metrics
        self._router = Router(settings.routing, settings.topics, engine_json(engine_info))
        self._guard = DlqGuard(settings.dlq)

    def build(
        self, records: Sequence[InputRecord], event_ids: Sequence[str | None], outcomes: Sequence[Outcome]
    ) -> tuple[list[OutRecord], int]:
        """The output records of every record, in order, and how many records were dead-lettered.

        Raises `DlqGuardTrippedError` (nothing of these records is then published).
        """
        route = self._router.outputs
        decided_at = datetime_json(datetime.now(UTC))  # records answered together share the time
        guard = self._guard
        answered = 0  # counted in the guard in runs, in record order (before each dead letter)
        dead = 0
        routed: dict[str, int] = {}  # route topic -> records, for the metric (one inc per topic per call)
        out: list[OutRecord] = []
        for record, event_id, outcome in zip(records, event_ids, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                guard.record_ok(answered)
                answered = 0
                out.append(self._dead_letter(record, outcome))
                dead += 1
                continue
            answered += 1
            if outcome.x_state_truncated:
                self._metrics.state_truncated.inc()
            out += route(record, outcome, event_id, decided_at)
            routed[out[-1].topic] = routed.get(out[-1].topic, 0) + 1  # the route record comes last
        guard.record_ok(answered)
        for topic, count in routed.items():
            self._metrics.routed.labels(topic=topic).inc(count)
        return out, dead

    def _dead_letter(self, record: InputRecord, exc: BaseException) -> OutRecord:
        self._guard.record_dead()
        if isinstance(exc, EngineError):
            reason, cause, attempts = exc.reason, exc.cause, exc.attempts
        elif isinstance(exc, RequestError):
            reason, cause, attempts = exc.reason, exc, 1
        else:
            reason, cause, attempts = DlqReason.engine_failed, exc, 1
        stage = stage_for(reason) if isinstance(exc, RequestError | EngineError) else DlqStage.publish.value
        out, info = dead_letter(
            record, cause, topic=self._dlq_topic, stage=stage, attempts=attempts, reason=reason
        )
        self._metrics.dlq.labels(reason=reason.value).inc()
        log.info(
            "dead_letter",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            reason=reason.value,
            stage=stage,
            error=info.exception_fqcn,
        )
        return out
