"""The literal text of Clef's trained prompt format (SPEC section 5), as strings.

This module only builds strings; `engine.encoding.encode` tokenizes them piece by piece. Every constant here
must stay byte-identical to the trained format: a changed newline changes every answer.
"""

from __future__ import annotations

from pydantic import JsonValue

from schemas.systemone import (
    ChoiceQuestion,
    NoulQuestion,
    ScoreQuestion,
    effective_instructions,
    render_value,
)

SYSTEM = (
    "Read the complete state and schema. Decide every field jointly. "
    "Each answer must be exactly one of that field's allowed options."
)
"""The system instruction inside the prefix P."""

PREFIX = "<|im_start|>system\n" + SYSTEM + "<|im_end|>\n<|im_start|>user\nSTATE:\n"
"""P: everything before the media tokens and the state."""

SCHEMA_HEADER = "\n\nSCHEMA FIELDS:\n"
"""First piece of Q, right after the state."""

ALLOWED_OPTIONS = "\nALLOWED OPTIONS:\n"
"""Piece after a question's instruction span."""

OPTION_END = "\n"
"""Piece after every option span."""

FIELD_END = "END FIELD\n"
"""Piece closing every question."""

SUFFIX = "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:"
"""X: the assistant turn the head reads from."""

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>\n"
AUDIO_PLACEHOLDER = "<|audio_start|><|audio_pad|><|audio_end|>\n"
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>\n"
"""Media placeholders handed to the processor (one per item, each followed by a newline)."""

FORMAT_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")
"""Tokens of P and X that a compatible tokenizer must map to one id each."""


def render(value: JsonValue) -> str:
    """SPEC section 5 `render`: a string as is; anything else compact JSON (sorted keys at every depth,
    `,` and `:` without spaces, non-ASCII kept, floats in their shortest round-trip form)."""
    return render_value(value)


def instruction_text(question_id: str, question: NoulQuestion | ChoiceQuestion | ScoreQuestion) -> str:
    """The question span's text: render(instructions), or the id when they are missing, null or ""."""
    return render(effective_instructions(question_id, question))


def field_header(index: int, question_id: str, question_type: str) -> str:
    """The piece before question `index`'s (1-based) instruction span."""
    return f"\nFIELD {index}\nID: {question_id}\nTYPE: {question_type}\nINSTRUCTION: "


def option_prefix(index: int) -> str:
    """The piece before option `index`'s (1-based) span."""
    return f"OPTION {index}: "


def option_text(option_id: str, description: JsonValue) -> str:
    """The option span's text; the "description" key is left out when the description is null."""
    if description is None:
        return render({"option_id": option_id})
    return render({"option_id": option_id, "description": description})
