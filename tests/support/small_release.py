"""A small random release in the published per-expert layout (`bench.release_writer`), for the tests of
the release writer and of the router levelling: 3 layers of 8 experts, text towers only, several shards."""

from __future__ import annotations

from pathlib import Path

from bench.release_writer import WrittenRelease, write_fullsize_release

#: Text-model overrides that make `write_fullsize_release` write a release of a few MB.
SMALL = {
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 2048,
}


def write_small_release(path: Path) -> WrittenRelease:
    """`write_fullsize_release` of `SMALL` at `path` (150 kB shards, small towers, silent)."""
    return write_fullsize_release(
        path, shard_bytes=150_000, text_overrides=SMALL, full_towers=False, log=lambda _: None
    )
