"""`engine.model.thinker.part_paths` finds the text decoder, towers and lm_head in either transformers 5.x
module tree (the one way the engine locates the text decoder), and `checkpoint_names` maps both onto the
release's names."""

from __future__ import annotations

import pytest
from torch import nn

from engine.model.thinker import checkpoint_names, part_paths


class _Text(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(4, 2)
        self.layers = nn.ModuleList([nn.Linear(2, 2)])


class _Thinker(nn.Module):
    """The thinker's parts laid out as transformers 5.17 (`nested=False`) or 5.24 (`nested=True`) does."""

    def __init__(self, nested: bool) -> None:
        super().__init__()
        text = _Text()
        self.text_path = "model.language_model" if nested else "model"
        if nested:
            self.model = nn.Module()
            self.model.language_model = text
            self.model.visual = nn.Linear(1, 1)
            self.model.audio_tower = nn.Linear(1, 1)
        else:
            self.model = text
            self.visual = nn.Linear(1, 1)
            self.audio_tower = nn.Linear(1, 1)
        self.lm_head = nn.Linear(2, 4, bias=False)

    def get_input_embeddings(self) -> nn.Module:
        return self.get_submodule(self.text_path).embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


def test_early_5x_layout() -> None:
    thinker = _Thinker(nested=False)
    assert part_paths(thinker) == {
        "model": "model",
        "lm_head": "lm_head",
        "visual": "visual",
        "audio_tower": "audio_tower",
    }


def test_later_5x_layout_maps_onto_the_release_names() -> None:
    thinker = _Thinker(nested=True)
    paths = part_paths(thinker)
    assert paths == {
        "model": "model.language_model",
        "lm_head": "lm_head",
        "visual": "model.visual",
        "audio_tower": "model.audio_tower",
    }
    names = checkpoint_names(thinker)
    assert names["model.language_model.embed_tokens.weight"] == "thinker.model.embed_tokens.weight"
    assert names["model.visual.weight"] == "thinker.visual.weight"
    assert names["lm_head.weight"] == "thinker.lm_head.weight"


def test_a_tree_without_a_text_decoder_is_a_clear_error() -> None:
    thinker = _Thinker(nested=False)
    thinker.get_input_embeddings = lambda: nn.Embedding(4, 2)  # type: ignore[method-assign]  # not in the tree
    with pytest.raises(ValueError, match="cannot place the thinker's input embeddings"):
        part_paths(thinker)
