"""Fixtures for the text side of the engine: an in-test BPE tokenizer and the tiny release."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

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


@pytest.fixture(scope="session")
def tiny_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight release written once per session (skipped until engine.tiny exists)."""
    tiny = pytest.importorskip("engine.tiny")
    path = tmp_path_factory.mktemp("tiny-release")
    tiny.write_tiny_release(path, seed=0)
    return path
