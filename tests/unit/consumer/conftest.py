"""Every consumer unit test closes the batchers it makes: a `Batcher`'s prepare threads (`clef-prepare_*`)
that a test leaves running live on through the rest of the suite."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

PREPARE_THREADS = "clef-prepare"
JOIN_S = 2.0


@pytest.fixture(autouse=True)
def no_prepare_thread_left() -> Iterator[None]:
    """Fails a test after which a prepare thread it started is still alive (each is given `JOIN_S` to end,
    as `Batcher.close` joins them)."""
    before = {t.ident for t in threading.enumerate()}
    yield
    left = [t for t in threading.enumerate() if t.ident not in before and t.name.startswith(PREPARE_THREADS)]
    for t in left:
        t.join(JOIN_S)
    alive = sorted(t.name for t in left if t.is_alive())
    assert not alive, f"prepare threads left running (close the test's Batcher): {alive}"
