"""engine.model.media finds the thinker's text model under either transformers 5.x layout."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.model.media import _flat, text_model


def _text() -> SimpleNamespace:
    return SimpleNamespace(embed_tokens=object(), layers=[])


def test_text_model_in_early_5x_layout() -> None:
    text = _text()
    assert text_model(SimpleNamespace(model=text)) is text  # thinker.model (5.17)


def test_text_model_in_later_5x_layout() -> None:
    text = _text()
    inner = SimpleNamespace(language_model=text, visual=object(), audio_tower=object())
    assert text_model(SimpleNamespace(model=inner)) is text  # thinker.model.language_model (5.24)


def test_unknown_layout_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="cannot find the text model"):
        text_model(SimpleNamespace(model=SimpleNamespace(visual=object())))


def test_features_as_one_tensor_or_per_item() -> None:
    a, b = torch.ones(2, 3), torch.zeros(1, 3)
    assert torch.equal(_flat((a, b)), torch.cat([a, b]))
    assert _flat(a) is a
