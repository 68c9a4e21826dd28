"""SystemOne request models (SPEC section 2) and the per-question option tables (SPEC section 5).

Pydantic validates at the edge; everything after validation is read-only. A question id or choice option id
is any non-empty string of at most `MAX_ID_CHARS` characters (spaces, emoji, `/`, `:` included) and
round-trips byte for byte: nothing is normalised, trimmed or re-cased.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

import structlog
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)

_log = structlog.get_logger(__name__)

MAX_QUESTIONS: Final = 64
MAX_ID_CHARS: Final = 1000
MIN_CHOICE_OPTIONS: Final = 2
MAX_CHOICE_OPTIONS: Final = 255
MIN_SCORE_LEVELS: Final = 2
MAX_SCORE_LEVELS: Final = 10
MAX_IMAGES: Final = 4
MAX_AUDIO: Final = 4
MAX_VIDEOS: Final = 2

DEFAULT_TRUE_DESCRIPTION: Final = "The proposition is true or the answer is yes."
DEFAULT_FALSE_DESCRIPTION: Final = "The proposition is false or the answer is no."

_STRING_OBJECT_ARRAY: Final = {"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "array"}]}


def _check_state(value: JsonValue) -> JsonValue:
    if not isinstance(value, str | dict | list):
        raise ValueError("state must be a string, object or array")
    return value


def _check_description(value: JsonValue) -> JsonValue:
    if value is not None and not isinstance(value, str | dict | list):
        raise ValueError("must be a string, object, array or null")
    return value


def _check_media_item(value: object) -> object:
    # Wire items are strings; Python callers may also pass decoded objects (PIL images, numpy arrays)
    # that engine.media validates. JSON scalars and containers other than strings are never media.
    if value is None or isinstance(value, bool | int | float | dict | list):
        raise ValueError("media item must be a string (data URL, base64, URL or path)")
    return value


QuestionId = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)]
OptionId = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)]
State = Annotated[JsonValue, AfterValidator(_check_state), WithJsonSchema(_STRING_OBJECT_ARRAY)]
Description = Annotated[
    JsonValue,
    AfterValidator(_check_description),
    WithJsonSchema({"anyOf": [*_STRING_OBJECT_ARRAY["anyOf"], {"type": "null"}]}),
]
MediaItem = Annotated[
    Any,
    AfterValidator(_check_media_item),
    WithJsonSchema({"type": "string", "description": "data URL, bare base64, http(s) URL or path"}),
]


class _QuestionBase(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    instructions: Description = None
    """What to decide; missing, null or "" means the question id is the instruction (`{}`/`[]` do not;
    see `effective_instructions`)."""


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


class NoulCriteria(BaseModel):
    """Descriptions of the two noul options. A key that is absent keeps its default description; a key given
    as null means no description at all (the option is encoded without a "description" key)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    # Absent and null differ, so `option_table` reads `model_fields_set`: a Python caller passing `true=None`
    # explicitly also drops the description. The schema shows no default, as null is not what absent means.
    true: Description = Field(default=None, json_schema_extra=_no_default)
    false: Description = Field(default=None, json_schema_extra=_no_default)


class NoulQuestion(_QuestionBase):
    """A yes/no question; the answer is P(true)."""

    type: Literal["noul"] = "noul"
    criteria: NoulCriteria | None = None


class ChoiceQuestion(_QuestionBase):
    """Pick one of 2..255 options; `criteria` maps option id -> description (order = request order)."""

    type: Literal["choice"] = "choice"
    criteria: dict[OptionId, Description] = Field(
        min_length=MIN_CHOICE_OPTIONS, max_length=MAX_CHOICE_OPTIONS
    )


class ScoreQuestion(_QuestionBase):
    """An ordinal scale of 2..10 level descriptions, lowest first (an object here is refused)."""

    type: Literal["score"] = "score"
    criteria: list[Description] = Field(min_length=MIN_SCORE_LEVELS, max_length=MAX_SCORE_LEVELS)


Question = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]


class SystemOneRequest(BaseModel):
    """A SystemOne request body (SPEC section 2). Unknown top-level fields are ignored (logged at debug).

    `questions` keeps insertion order, which is the request order of the answers.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str = "clef-omni"
    state: State
    questions: dict[QuestionId, Question] = Field(min_length=1, max_length=MAX_QUESTIONS)
    images: list[MediaItem] | None = Field(default=None, max_length=MAX_IMAGES)
    audio: list[MediaItem] | None = Field(default=None, max_length=MAX_AUDIO)
    videos: list[MediaItem] | None = Field(default=None, max_length=MAX_VIDEOS)

    @model_validator(mode="before")
    @classmethod
    def _log_unknown_fields(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = [key for key in data if key not in cls.model_fields]
            if unknown:
                # Names only (shortened), never values: they may be large or sensitive.
                names = [str(key)[:64] for key in unknown[:10]]
                # Best effort: inside a validator, a broken log sink would otherwise turn a valid
                # request into a schema violation.
                with contextlib.suppress(Exception):
                    _log.debug("systemone_unknown_fields_ignored", fields=names, count=len(unknown))
        return data

    @property
    def has_media(self) -> bool:
        """True when any of images/audio/videos is a non-empty list."""
        return bool(self.images or self.audio or self.videos)


@dataclass(frozen=True, slots=True)
class Option:
    """One answer option of a question, in encoding order: `id` as the response keys it, `description`
    as given (None: the encoder omits the "description" key)."""

    id: str
    description: JsonValue | None


def option_table(question: NoulQuestion | ChoiceQuestion | ScoreQuestion) -> list[Option]:
    """The options of `question` in ENCODING order (SPEC section 5).

    noul: `true` then `false`, default descriptions overlaid key by key by the criteria (a key given as null
    yields `description=None`; criteria null or `{}` keep both defaults);
    choice: option ids sorted as Python strings (code point order); score: levels "0".."n-1".
    Model probabilities arrive in this order; `build_response` maps them back to request order.
    """
    if isinstance(question, NoulQuestion):
        criteria = question.criteria
        if criteria is None:
            return [Option("true", DEFAULT_TRUE_DESCRIPTION), Option("false", DEFAULT_FALSE_DESCRIPTION)]
        given = criteria.model_fields_set
        return [
            Option("true", criteria.true if "true" in given else DEFAULT_TRUE_DESCRIPTION),
            Option("false", criteria.false if "false" in given else DEFAULT_FALSE_DESCRIPTION),
        ]
    if isinstance(question, ChoiceQuestion):
        return [Option(key, question.criteria[key]) for key in sorted(question.criteria)]
    return [Option(str(index), level) for index, level in enumerate(question.criteria)]


def effective_instructions(
    question_id: str, question: NoulQuestion | ChoiceQuestion | ScoreQuestion
) -> JsonValue:
    """The question's instructions, or its id when they are missing, null or exactly "" (SPEC section 2).

    `{}` and `[]` are instructions like any other value: they render as `{}` and `[]`.
    """
    instructions = question.instructions
    if instructions is None or instructions == "":
        return question_id
    return instructions


def render_value(value: JsonValue) -> str:
    """SPEC section 5 `render`: a string as is, anything else compact sorted-key JSON, non-ASCII kept."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
