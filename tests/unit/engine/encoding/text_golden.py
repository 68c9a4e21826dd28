"""Test-side expectations for the encoding golden tests, computed from literal strings only.

Nothing here calls the engine: pieces are written out as the SPEC states them and tokenized one by one
with the raw `tokenizers.Tokenizer`, so a mistake in `engine.encoding.encode`/`engine.encoding.render` cannot
hide in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

P = (
    "<|im_start|>system\nRead the complete state and schema. Decide every field jointly. Each answer must be "
    "exactly one of that field's allowed options.<|im_end|>\n<|im_start|>user\nSTATE:\n"
)
X = "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:"
SCHEMA = "\n\nSCHEMA FIELDS:\n"
ALLOWED = "\nALLOWED OPTIONS:\n"
NL = "\n"
END = "END FIELD\n"
TRUE_DEFAULT = "The proposition is true or the answer is yes."
FALSE_DEFAULT = "The proposition is false or the answer is no."

QUESTION = "question"
OPTION = "option"


@dataclass(frozen=True)
class Expected:
    input_ids: list[int]
    question_spans: list[tuple[int, int]]
    option_spans: list[tuple[int, int]]  # flat, in encoding order
    question_texts: list[str]
    option_texts: list[str]


def ids_of(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False).ids)


def expect(tok: Tokenizer, pieces: Sequence[tuple[str, str | None]]) -> Expected:
    """Concatenate the separately tokenized `pieces`; tagged pieces become spans."""
    ids: list[int] = []
    q_spans: list[tuple[int, int]] = []
    o_spans: list[tuple[int, int]] = []
    q_texts: list[str] = []
    o_texts: list[str] = []
    for text, tag in pieces:
        piece = ids_of(tok, text)
        span = (len(ids), len(ids) + len(piece))
        if tag == QUESTION:
            q_spans.append(span)
            q_texts.append(text)
        elif tag == OPTION:
            o_spans.append(span)
            o_texts.append(text)
        ids.extend(piece)
    return Expected(ids, q_spans, o_spans, q_texts, o_texts)


def field(
    i: int, qid: str, qtype: str, instruction: str, options: Sequence[str]
) -> list[tuple[str, str | None]]:
    """One question's pieces; `options` are the already rendered option JSON texts in encoding order."""
    out: list[tuple[str, str | None]] = [
        (f"\nFIELD {i}\nID: {qid}\nTYPE: {qtype}\nINSTRUCTION: ", None),
        (instruction, QUESTION),
        (ALLOWED, None),
    ]
    for j, option in enumerate(options, start=1):
        out += [(f"OPTION {j}: ", None), (option, OPTION), (NL, None)]
    out.append((END, None))
    return out


def prompt(state: str, fields: Sequence[list[tuple[str, str | None]]]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = [(P, None), (state, None), (SCHEMA, None)]
    for f in fields:
        out += f
    out.append((X, None))
    return out
