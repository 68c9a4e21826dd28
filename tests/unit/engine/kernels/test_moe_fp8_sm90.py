"""`engine.kernels.moe_fp8_sm90` on the CPU: which calls it takes, that its sources ship complete, and that
the wrappers hand the extension the tensors the binding checks (a fake extension; the kernels' own tests are
tests/gpu/test_moe_fp8_sm90_gpu.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension

from engine.kernels import fp8, moe_fp8_sm90


def test_takes_large_calls_of_supported_sizes() -> None:
    experts = 128
    rows = moe_fp8_sm90.FROM_ROWS_PER_EXPERT
    assert moe_fp8_sm90.takes(rows * experts, experts, 2048, 768)
    assert not moe_fp8_sm90.takes(rows * experts - 1, experts, 2048, 768)
    assert not moe_fp8_sm90.takes(10 * rows * experts, experts, 2048 + 128, 768)  # H not a multiple of 256
    assert not moe_fp8_sm90.takes(10 * rows * experts, experts, 2048, 768 + 64)  # I not a multiple of 128


def test_takes_the_down_gemm_alone_from_fewer_rows() -> None:
    experts = 128
    rows = moe_fp8_sm90.DOWN_FROM_ROWS_PER_EXPERT
    assert rows < moe_fp8_sm90.FROM_ROWS_PER_EXPERT
    assert moe_fp8_sm90.takes_down(rows * experts, experts, 2048, 768)
    assert not moe_fp8_sm90.takes_down(rows * experts - 1, experts, 2048, 768)
    assert not moe_fp8_sm90.takes(rows * experts, experts, 2048, 768)
    sizes = (rows * experts - 1, rows * experts, moe_fp8_sm90.FROM_ROWS_PER_EXPERT * experts)
    assert [moe_fp8_sm90.path_for(n, experts, 2048, 768) for n in sizes] == [None, "down", "both"]
    assert not moe_fp8_sm90.takes_down(10 * rows * experts, experts, 2048 + 128, 768)
    assert not moe_fp8_sm90.takes_down(10 * rows * experts, experts, 2048, 768 + 64)


def test_sources_and_their_local_includes_ship() -> None:
    names = set(moe_fp8_sm90.SOURCES)
    for name in moe_fp8_sm90.SOURCES:
        text = (moe_fp8_sm90.CSRC / name).read_text("utf-8")
        for included in re.findall(r'#include "([^"]+)"', text):
            assert (moe_fp8_sm90.CSRC / included).is_file(), f"{name} includes a missing {included}"
            names.add(included)
    shipped = {p.name for p in moe_fp8_sm90.CSRC.iterdir()}
    assert names == shipped, f"csrc holds files no source uses: {shipped - names}"


class _Recorder:
    """A stand-in for the compiled module: records what each call was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[torch.Tensor, ...], int, bool, int]] = []

    def gate_up_fp8(self, *args: torch.Tensor | int | bool) -> None:
        self.calls.append(("gate_up_fp8", *_split(args)))

    def down_fp8(self, *args: torch.Tensor | int | bool) -> None:
        self.calls.append(("down_fp8", *_split(args)))

    def clusters_fit(self) -> tuple[int, int]:
        return 66, 66


def _split(
    args: tuple[torch.Tensor | int | bool, ...],
) -> tuple[tuple[torch.Tensor, ...], int, bool, int]:
    # (the tensors, the trailing `clusters`, `solo` and `ablate`) of one call
    *tensors, clusters, solo, ablate = args
    assert all(isinstance(a, torch.Tensor) for a in tensors)
    assert isinstance(clusters, int)
    assert isinstance(solo, bool)
    assert isinstance(ablate, int)
    return tuple(a for a in tensors if isinstance(a, torch.Tensor)), clusters, solo, ablate


def test_wrappers_allocate_the_outputs_the_binding_checks() -> None:
    e, hidden, inter, t, k = 4, 256, 256, 3, 2
    q8 = fp8.quantize_experts(
        torch.randn(e, 2 * inter, hidden).bfloat16(), torch.randn(e, hidden, inter).bfloat16()
    )
    x = torch.randn(t, hidden).bfloat16()
    order = torch.arange(t * k, dtype=torch.int32)
    counts = torch.tensor([2, 0, 3, 1], dtype=torch.int32)
    top_w = torch.full((t, k), 0.5)
    rec = _Recorder()
    act, act_s = moe_fp8_sm90.gate_up_fp8(rec, x, order, counts, top_w, q8)
    assert act.shape == (t * k, inter)
    assert act.dtype == fp8.FP8
    assert act_s.shape == (t * k, inter // 128)
    assert act_s.dtype == torch.float32
    name, args, clusters, solo, ablate = rec.calls[0]
    assert clusters == 0  # as many clusters as fit, by default
    assert not solo
    assert ablate == 0
    assert name == "gate_up_fp8"
    assert args[-2] is act
    assert args[-1] is act_s
    assert args[0].dtype == fp8.FP8
    assert args[0].shape == (t, hidden)
    y = moe_fp8_sm90.down_fp8(rec, act, torch.ones(t * k), order, counts, q8)
    assert y.shape == (t * k, hidden)
    assert y.dtype == torch.bfloat16
    assert rec.calls[1][0] == "down_fp8"
    assert rec.calls[1][1][-1] is y
    empty = moe_fp8_sm90.gate_up_fp8(rec, x[:0], order[:0], counts, top_w[:0], q8)
    assert empty[0].shape == (0, inter)
    assert len(rec.calls) == 2


def test_the_toolchain_check_names_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    assert "no nvcc" in (moe_fp8_sm90.toolchain_problem() or "")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path))  # a CUDA_HOME without bin/nvcc
    assert "no nvcc" in (moe_fp8_sm90.toolchain_problem() or "")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    assert moe_fp8_sm90.toolchain_problem() == "no ninja on PATH"
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: True)
    assert moe_fp8_sm90.toolchain_problem() is None


def test_build_for_refuses_a_device_that_is_no_hopper_gpu() -> None:
    with pytest.raises(moe_fp8_sm90.Sm90UnavailableError, match="need a Hopper GPU"):
        moe_fp8_sm90.build_for(torch.device("cpu"))
