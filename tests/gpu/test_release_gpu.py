"""The release reader's CUDA path: pinned buffers, one stream per reader, casts on the device.

The CPU tests (tests/unit/engine/test_loader.py) cover the plan and the reader's CPU path; here the same
tiny releases go to the GPU and must give the CPU's weights bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from devtools.tiny_release import write_tiny_release
from engine.model.release import LoadedModel, load_release_model
from engine.model.release_read import ReadOptions

pytestmark = pytest.mark.gpu


def _same(a: LoadedModel, b: LoadedModel) -> None:
    theirs = b.model.thinker.state_dict()
    for name, value in a.model.thinker.state_dict().items():
        assert torch.equal(value.cpu(), theirs[name].cpu()), name


@pytest.mark.parametrize("layout", ["per-expert", "fused"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("chunk_bytes", [1000, 64 << 20])
def test_cuda_load_equals_cpu_load(tmp_path: Path, layout: str, dtype: torch.dtype, chunk_bytes: int) -> None:
    root = write_tiny_release(tmp_path / "r", seed=0, layout=layout)  # type: ignore[arg-type]
    options = ReadOptions(workers=4, chunk_bytes=chunk_bytes, depth=2)
    gpu = load_release_model(root, device="cuda", dtype=dtype, load_processor=False, read_options=options)
    cpu = load_release_model(root, device="cpu", dtype=dtype, load_processor=False)
    assert all(p.device.type == "cuda" for p in gpu.model.thinker.parameters())
    _same(gpu, cpu)


def test_float32_release_cast_to_bf16_on_the_device(tmp_path: Path) -> None:
    root = write_tiny_release(tmp_path / "r", seed=0)
    for shard in sorted(root.glob("model-*.safetensors")):
        save_file(
            {k: v.float() for k, v in load_file(str(shard)).items()}, str(shard), metadata={"format": "pt"}
        )
    options = ReadOptions(workers=3, chunk_bytes=4096)
    gpu = load_release_model(
        root, device="cuda", dtype=torch.bfloat16, load_processor=False, read_options=options
    )
    cpu = load_release_model(root, device="cpu", dtype=torch.bfloat16, load_processor=False)
    _same(gpu, cpu)
