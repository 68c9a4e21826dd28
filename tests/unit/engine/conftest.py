"""Shared fixtures: a float32 CPU model of the session's tiny release (`tiny_release`, from
tests/unit/conftest.py), random encoded records, and an in-test BPE tokenizer for the engine's text side."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from engine.model.release import LoadedModel, load_release_model
from engine.types import EncodedRequest


@pytest.fixture(scope="session")
def loaded(tiny_release: Path) -> LoadedModel:
    return load_release_model(tiny_release, device="cpu", dtype=torch.float32, load_processor=False)


def make_record(rng: random.Random, length: int, num_questions: int, vocab: int = 858) -> EncodedRequest:
    """A record with random token ids and non-overlapping question/option spans (2..5 options each)."""
    questions, options = [], []
    pos = 3
    for _ in range(num_questions):
        width = rng.randrange(1, 5)
        questions.append((pos, pos + width))
        pos += width + 1
        spans = []
        for _ in range(rng.randrange(2, 6)):
            w = rng.randrange(1, 6)
            spans.append((pos, pos + w))
            pos += w + rng.randrange(0, 2)
        options.append(tuple(spans))
    length = max(length, pos + 2)
    return EncodedRequest(
        input_ids=tuple(rng.randrange(vocab) for _ in range(length)),
        question_ids=tuple(f"q{k}" for k in range(num_questions)),
        question_types=tuple(rng.randrange(3) for _ in range(num_questions)),
        question_spans=tuple(questions),
        option_spans=tuple(options),
    )


@pytest.fixture
def records() -> list[EncodedRequest]:
    rng = random.Random(1234)
    return [make_record(rng, n, q) for n, q in ((40, 1), (130, 3), (75, 2), (200, 5), (12, 1))]


SPECIAL = [
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
]

_CORPUS = [
    "system\nRead the complete state and schema. Decide every field jointly.",
    "Each answer must be exactly one of that field's allowed options.\nuser\nSTATE:\n",
    "\n\nSCHEMA FIELDS:\n\nFIELD 1\nID: department\nTYPE: choice\nINSTRUCTION: Which team owns it?",
    '\nALLOWED OPTIONS:\nOPTION 1: {"description":"The proposition is true","option_id":"true"}\n',
    "END FIELD\n\nassistant\n\n\nJOINT SCHEMA DECISIONS: disk full on db-1, latency spike, outage",
    '{"host":"db-1","level":"error","message":"disk full"} noul score urgency',
]


def build_bpe_tokenizer() -> Tokenizer:
    """A small byte-level BPE trained here, so merges cross piece boundaries like a real tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    return tok


@pytest.fixture(scope="session")
def bpe_tokenizer() -> Tokenizer:
    return build_bpe_tokenizer()
