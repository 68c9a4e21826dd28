"""Every media case of the vendor's conformance fixture through our media path: exact input_ids, and the
media diagnosis (shapes, grids, seconds per grid, use_audio_in_video, audio feature frames, per-item mean
pixel value and mean audio feature within 1e-6) equal to the reference's. Runs under every supported
transformers version (no model is loaded; see media_conformance.py)."""

from __future__ import annotations

import pytest

from tests.unit.engine.media.media_conformance import fixture_dir, media_cases, run_case

FIXTURE = fixture_dir()
CASES = media_cases(FIXTURE) if FIXTURE is not None else []
pytestmark = pytest.mark.skipif(FIXTURE is None, reason="no conformance fixture in this checkout")


def test_the_fixture_has_every_kind_of_media_case() -> None:
    names = {case.name for case in CASES}
    assert len(CASES) == 18
    assert {
        "image-two",
        "audio-wav-44k-stereo",
        "video-mp4-640x480-1fps-sound",
        "two-videos-both-sound",
    } <= names


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_media_case_matches_the_reference(case: object) -> None:
    assert FIXTURE is not None
    result = run_case(FIXTURE, case)  # type: ignore[arg-type]
    assert not result.problems, "\n".join(result.problems)
