"""The packed text decoder (`engine.model.decoder`) on CPU: padding records behind a record (as the CUDA
graphs run it) leave the record's output alone, and the forward in pieces (`engine.model.graphs`) equals
the whole forward."""

from __future__ import annotations

import itertools

import torch

from engine.model.decoder import PackedInputs, PackedTextDecoder
from engine.model.graphs import graph_pieces
from engine.model.release import LoadedModel


def test_decoder_with_padding_records_behind_a_record_equals_the_record_alone(loaded: LoadedModel) -> None:
    text_model = loaded.model.text_model
    decoder = PackedTextDecoder(text_model)
    ids = torch.randint(0, 800, (32,), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        emb = text_model.embed_tokens(ids)
        pos = torch.arange(32)[None].expand(3, -1)
        alone = decoder(PackedInputs(emb[:20], pos[:, :20], torch.tensor([0, 20]).int(), 20))
        padded_emb = torch.cat([emb[:20], torch.zeros_like(emb[20:])])
        cu = torch.tensor([0, 20, 28, 32, 32]).int()  # the record, padding records, an empty slot
        padded = decoder(PackedInputs(padded_emb, pos, cu, 20))
    assert torch.allclose(padded[:20], alone, atol=1e-5, rtol=1e-4)


def test_decoder_in_pieces_equals_the_whole_forward(loaded: LoadedModel) -> None:
    """Graphs capture the forward as `begin` and then layer ranges (`graph_pieces`): the pieces cover
    every layer once, in order, and chained they give the whole forward's output bit for bit."""
    text_model = loaded.model.text_model
    decoder = PackedTextDecoder(text_model)
    n = decoder.num_layers
    for layers in (1, 2, 3, 10, 48):
        pieces = graph_pieces(layers)
        assert pieces[0][0] == 0
        assert pieces[-1][1] == layers
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(pieces))
    ids = torch.randint(0, 800, (19,), generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        p = PackedInputs(
            text_model.embed_tokens(ids),
            torch.arange(19)[None].expand(3, -1),
            torch.tensor([0, 7, 19]).int(),
            12,
        )
        whole = decoder(p)
        for split in range(n + 1):
            state = decoder.layers(decoder.layers(decoder.begin(p), p, 0, split), p, split, n)
            assert torch.equal(state.h, whole), split


def test_between_runs_after_every_layer_but_the_last_and_leaves_the_output(loaded: LoadedModel) -> None:
    """The `between` hook (where an urgent batch runs inside a long one) is called once after each layer
    but the last; a whole other forward run inside it changes neither forward's output."""
    text_model = loaded.model.text_model
    decoder = PackedTextDecoder(text_model)
    gen = torch.Generator().manual_seed(8)
    ids, other_ids = torch.randint(0, 800, (23,), generator=gen), torch.randint(0, 800, (9,), generator=gen)

    def inputs(tokens: torch.Tensor) -> PackedInputs:
        n = tokens.numel()
        return PackedInputs(
            text_model.embed_tokens(tokens),
            torch.arange(n)[None].expand(3, -1),
            torch.tensor([0, n]).int(),
            n,
        )

    with torch.inference_mode():
        p, q = inputs(ids), inputs(other_ids)
        alone, other_alone = decoder(p), decoder(q)
        inside: list[torch.Tensor] = []
        interleaved = decoder(p, lambda: inside.append(decoder(q)))
    assert len(inside) == decoder.num_layers - 1
    assert torch.equal(interleaved, alone)
    assert all(torch.equal(h, other_alone) for h in inside)
