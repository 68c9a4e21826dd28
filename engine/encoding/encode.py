"""Request -> token ids and spans, exactly in Clef's trained format (SPEC section 5). CPU only.

Every piece of the prompt is tokenized on its own, without special-token insertion, and the id lists
are concatenated: text at a piece boundary is never merged across it (that is the trained format).
Pieces that repeat across requests (the prefix, the suffix, question headers, options of a fixed
schema) are cached per tokenizer, so a typical request only tokenizes its state.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.encoding import render as fmt
from engine.types import TYPE_CHOICE, TYPE_NOUL, TYPE_SCORE, EncodedRequest, Span
from schemas.systemone import DlqReason, RequestError, SystemOneRequest, option_table

DEFAULT_MAX_TOKENS = 64_000
"""Clef's maximum input length in tokens (SPEC section 5)."""

_TYPE_IDS = {"noul": TYPE_NOUL, "choice": TYPE_CHOICE, "score": TYPE_SCORE}

_MAX_CACHED_CHARS = 4096
"""Longer pieces (large descriptions) are tokenized every time, so the cache's memory stays bounded."""

BatchEncode = Callable[[list[str]], list[list[int]]]
"""Tokenizes several texts at once, each without special-token insertion."""


def _batch_encoder(tokenizer: object) -> BatchEncode:
    """Find the fastest way to tokenize with `tokenizer` (a `tokenizers.Tokenizer`, a transformers
    tokenizer, or a processor carrying one as `.tokenizer`). Raises `TypeError` for anything else."""
    # Probes of third-party tokenizers: a transformers fast tokenizer wraps a `tokenizers.Tokenizer` as
    # `backend_tokenizer`; a `tokenizers.Tokenizer` itself has `encode_batch`.
    backend: Any = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and callable(getattr(tokenizer, "encode_batch", None)):
        backend = tokenizer
    if backend is not None:
        # encode_batch_fast (tokenizers >= 0.21) skips the character offsets we never read.
        batch = getattr(backend, "encode_batch_fast", None) or backend.encode_batch

        def encode_fast(texts: list[str]) -> list[list[int]]:
            return [e.ids for e in batch(texts, add_special_tokens=False)]

        return encode_fast
    # A transformers processor carries its tokenizer as `.tokenizer`.
    inner = getattr(tokenizer, "tokenizer", None)
    if inner is not None and inner is not tokenizer:
        return _batch_encoder(inner)
    # A slow (pure-Python) transformers tokenizer offers only `encode`.
    slow: Any = getattr(tokenizer, "encode", None)
    if not callable(slow):
        raise TypeError(f"cannot tokenize with {type(tokenizer).__name__}: no encode method")

    def encode_slow(texts: list[str]) -> list[list[int]]:
        return [list(slow(t, add_special_tokens=False)) for t in texts]

    return encode_slow


class TextEncoder:
    """Encodes requests for one tokenizer, caching the token ids of repeated pieces.

    Thread-safe: `encode` may be called from many worker threads at once. Construction checks that
    the special tokens of the format map to single ids and raises `ValueError` when they do not.
    """

    def __init__(self, tokenizer: object, *, cache_size: int = 65_536) -> None:
        # Requests are encoded one per worker thread; the tokenizers library would otherwise fan each
        # small batch of pieces out over a pool as wide as the machine, competing for cores with the
        # thread that feeds the GPU.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self._encode_batch = _batch_encoder(tokenizer)
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        for token in fmt.FORMAT_SPECIAL_TOKENS:
            ids = self._encode_batch([token])[0]
            if len(ids) != 1:
                raise ValueError(f"tokenizer splits {token!r} into {len(ids)} ids: not a Clef tokenizer")
        self.prefix = self._pieces([fmt.PREFIX])[0]
        self.suffix = self._pieces([fmt.SUFFIX])[0]

    def _pieces(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        """Token ids of each text, from the cache where possible; misses are tokenized in one call."""
        out: list[tuple[int, ...] | None] = [None] * len(texts)
        missing: dict[str, list[int]] = {}
        with self._lock:
            for i, text in enumerate(texts):
                hit = self._cache.get(text)
                if hit is None:
                    missing.setdefault(text, []).append(i)
                else:
                    self._cache.move_to_end(text)
                    out[i] = hit
        if missing:
            fresh = [tuple(ids) for ids in self._encode_batch(list(missing))]
            with self._lock:
                for (text, positions), ids in zip(missing.items(), fresh, strict=True):
                    if len(text) <= _MAX_CACHED_CHARS:
                        self._cache[text] = ids
                    for i in positions:
                        out[i] = ids
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return [ids if ids is not None else () for ids in out]

    def encode(
        self,
        request: SystemOneRequest,
        *,
        media_tokens: Sequence[int] | None = None,
        media: Mapping[str, Any] | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        truncate_state: bool = True,
    ) -> EncodedRequest:
        """Encode `request` as P + M + S + Q + X; see `encode_request`."""
        # Schema pieces in order; question_piece/option_pieces index the pieces that are spans.
        pieces: list[str] = [fmt.SCHEMA_HEADER]
        question_ids: list[str] = []
        question_types: list[int] = []
        question_piece: list[int] = []
        option_pieces: list[list[int]] = []
        for index, (qid, question) in enumerate(request.questions.items(), start=1):
            question_ids.append(qid)
            question_types.append(_TYPE_IDS[question.type])
            pieces.append(fmt.field_header(index, qid, question.type))
            question_piece.append(len(pieces))
            pieces.append(fmt.instruction_text(qid, question))
            pieces.append(fmt.ALLOWED_OPTIONS)
            these: list[int] = []
            for j, option in enumerate(option_table(question), start=1):
                pieces.append(fmt.option_prefix(j))
                these.append(len(pieces))
                pieces.append(fmt.option_text(option.id, option.description))
                pieces.append(fmt.OPTION_END)
            option_pieces.append(these)
            pieces.append(fmt.FIELD_END)

        schema_ids = self._pieces(pieces)
        # The state is almost never repeated: tokenize it without polluting the cache.
        state = tuple(self._encode_batch([fmt.render(request.state)])[0])
        media_ids = tuple(media_tokens) if media_tokens is not None else ()

        fixed = len(self.prefix) + len(media_ids) + sum(map(len, schema_ids)) + len(self.suffix)
        truncated = False
        if fixed + len(state) > max_tokens:
            if fixed > max_tokens:
                raise _too_long(f"the schema and media need {fixed} tokens; the limit is {max_tokens}")
            if not truncate_state:
                raise _too_long(f"the request needs {fixed + len(state)} tokens; the limit is {max_tokens}")
            state = state[: max_tokens - fixed]
            truncated = True

        ids: list[int] = [*self.prefix, *media_ids, *state]
        starts: list[int] = []
        for piece in schema_ids:
            starts.append(len(ids))
            ids.extend(piece)
        ids.extend(self.suffix)

        def span(piece: int) -> Span:
            return (starts[piece], starts[piece] + len(schema_ids[piece]))

        return EncodedRequest(
            input_ids=tuple(ids),
            question_ids=tuple(question_ids),
            question_types=tuple(question_types),
            question_spans=tuple(span(p) for p in question_piece),
            option_spans=tuple(tuple(span(p) for p in opts) for opts in option_pieces),
            state_truncated=truncated,
            media=media,
            media_span=(len(self.prefix), len(self.prefix) + len(media_ids)) if media_ids else None,
        )


def _too_long(message: str) -> RequestError:
    return RequestError(DlqReason.context_length_exceeded, message, status=400)


_encoders: dict[int, tuple[object, TextEncoder]] = {}
_encoders_lock = threading.Lock()


def encoder_for(tokenizer: object) -> TextEncoder:
    """The shared `TextEncoder` of `tokenizer` (created on first use; kept alive with it)."""
    with _encoders_lock:
        entry = _encoders.get(id(tokenizer))
        if entry is None or entry[0] is not tokenizer:
            entry = (tokenizer, TextEncoder(tokenizer))
            _encoders[id(tokenizer)] = entry
        return entry[1]


def encode_request(
    request: SystemOneRequest,
    tokenizer: object,
    *,
    media_tokens: Sequence[int] | None = None,
    media: Mapping[str, Any] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    truncate_state: bool = True,
) -> EncodedRequest:
    """Encode a validated request as `P + M + S + Q + X` (SPEC section 5). CPU only, thread-safe.

    `media_tokens` are the already expanded media token ids M (images, then audio, then videos) and
    `media` the processor tensors carried along to the model. Spans are half-open offsets into the
    returned `input_ids`: a question span covers render(instructions or id), an option span covers
    render({"option_id", "description"}), options in `option_table` order.

    When the input exceeds `max_tokens`, the state keeps its head and `state_truncated` is set; raises
    `RequestError` (400, `context_length_exceeded`) when P+M+Q+X alone exceed it, or when the state
    would have to be cut but `truncate_state` is False.
    """
    return encoder_for(tokenizer).encode(
        request, media_tokens=media_tokens, media=media, max_tokens=max_tokens, truncate_state=truncate_state
    )
