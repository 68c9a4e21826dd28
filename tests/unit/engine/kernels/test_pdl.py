"""`engine.kernels.pdl`: the launch options a kernel gets, by device and by the `use` switch."""

from __future__ import annotations

import torch

from engine.kernels import pdl


def test_cpu_tensors_never_get_programmatic_launches() -> None:
    assert pdl.enabled()  # the engine's default
    assert pdl.options(torch.empty(1)) == {"pdl": False}


def test_use_switches_it_off_and_on_again() -> None:
    try:
        pdl.use(False)
        assert not pdl.enabled()
        assert pdl.options(torch.empty(1)) == {"pdl": False}
    finally:
        pdl.use(True)
    assert pdl.enabled()
