"""`bench.gate_up_sm90_probe`'s pure helpers: the real pair tiles of a routing and the per-k-step figure of
the `sweep` lines; and its refusal of a variant it does not know."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.gate_up_sm90_probe import main, pair_tiles, step_us


def test_pair_tiles_counts_256_row_tiles_per_expert() -> None:
    assert pair_tiles([0, 1, 256, 257, 512]) == 0 + 1 + 1 + 2 + 2
    assert pair_tiles([]) == 0


def test_step_us_spreads_the_time_over_the_active_clusters() -> None:
    # 810 items of 16 steps over 66 clusters in 578.5 us: each cluster spends about 2.95 us a step
    assert step_us(578.5, 0, 66, 810, 16) == pytest.approx(578.5 * 66 / (810 * 16))
    assert step_us(100.0, 4, 66, 810, 16) == pytest.approx(100.0 * 4 / (810 * 16))  # asked for 4
    assert step_us(100.0, 33, 66, 10, 16) == pytest.approx(100.0 / 16)  # never more clusters than items
    assert step_us(100.0, 0, 66, 0, 16) == 0.0


def test_an_unknown_variant_is_refused_before_anything_is_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        sys, "argv", ["gate_up_sm90_probe", "--variants", "bulk_store,nope", "--out", str(tmp_path)]
    )
    with pytest.raises(SystemExit) as ended:
        main()
    assert ended.value.code == 2
    assert "unknown variants ['nope']" in capsys.readouterr().err
