"""`python3 -m bench.cuda_ext_probe`: can the GPU machine build a CUDA C++ extension on CuTe (CUTLASS 4)?

The Triton FP8 expert kernels stall on their own pipelines at mid-size batches (BENCHMARKS.md, "Engine,
round eleven"); a warp-specialised TMA pipeline is what CUTLASS's Hopper kernels are built from. CUTLASS's
C++ headers come in the `nvidia-cutlass` wheel (6.4 MB, `cutlass_library/source/include`), and the GPU
machine has a CUDA toolkit with nvcc. This probe compiles one small kernel of its own through
`torch.utils.cpp_extension.load_inline` with those headers (CuTe tensors over global memory: y = x * s per
row, for sm_90a), runs it, checks it against torch, and prints one JSON line: nvcc's and CUTLASS's
versions, the build's seconds and whether the result matched. It needs `ninja` and `nvidia-cutlass`
importable (`device-engine.sh cuda_ext` installs them from `.carry/toolchain`). A probe: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from bench.report import start

_DECL = "torch::Tensor scale_rows(torch::Tensor x, torch::Tensor s);"

_SOURCE = r"""
#include <torch/extension.h>
#include <cute/tensor.hpp>

// y[r, c] = x[r, c] * s[r] for a row-major (rows, cols) float32 x: one block per row, CuTe tensors over
// the global pointers with a (rows, cols) : (cols, 1) layout.
__global__ void scale_rows_kernel(const float* x, float* y, const float* s, int rows, int cols) {
    auto layout = cute::make_layout(cute::make_shape(rows, cols), cute::make_stride(cols, 1));
    auto gx = cute::make_tensor(cute::make_gmem_ptr(x), layout);
    auto gy = cute::make_tensor(cute::make_gmem_ptr(y), layout);
    int r = blockIdx.x;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        gy(r, c) = gx(r, c) * s[r];
    }
}

torch::Tensor scale_rows(torch::Tensor x, torch::Tensor s) {
    TORCH_CHECK(x.is_cuda() && x.dtype() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous());
    TORCH_CHECK(s.is_cuda() && s.dtype() == torch::kFloat32 && s.numel() == x.size(0));
    auto y = torch::empty_like(x);
    int rows = static_cast<int>(x.size(0)), cols = static_cast<int>(x.size(1));
    if (rows > 0) {
        scale_rows_kernel<<<rows, 128>>>(
            x.data_ptr<float>(), y.data_ptr<float>(), s.data_ptr<float>(), rows, cols);
    }
    return y;
}
"""


def cutlass_include() -> Path:
    """The CUTLASS/CuTe header folder of the installed `nvidia-cutlass` wheel."""
    import cutlass_library  # type: ignore[import-not-found]  # the wheel's package; headers under source/include

    return Path(cutlass_library.__file__).parent / "source" / "include"


def main() -> int:
    from torch.utils.cpp_extension import CUDA_HOME, load_inline

    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    _, out, _ = start(p)
    include = cutlass_include()
    version = (include / "cutlass" / "version.h").read_text()
    parts = [re.search(rf"#define CUTLASS_{k} (\d+)", version) for k in ("MAJOR", "MINOR", "PATCH")]
    nvcc = (
        subprocess.run(
            [str(Path(CUDA_HOME or "/usr/local/cuda") / "bin" / "nvcc"), "--version"],
            capture_output=True,
            text=True,
            check=False,
        )
        .stdout.strip()
        .splitlines()
    )
    line: dict[str, object] = {
        "kind": "cuda_ext",
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "nvcc": nvcc[-1] if nvcc else None,
        "cutlass": ".".join(m.group(1) if m else "?" for m in parts),
    }
    with tempfile.TemporaryDirectory(prefix="clef-cuda-ext-") as build:
        t0 = time.perf_counter()
        ext = load_inline(  # type: ignore[no-untyped-call]
            name="clef_cute_probe",
            cpp_sources=[_DECL],
            cuda_sources=[_SOURCE],
            functions=["scale_rows"],
            extra_include_paths=[str(include)],
            extra_cuda_cflags=["-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a"],
            build_directory=build,
        )
        line["build_s"] = round(time.perf_counter() - t0, 1)
        x = torch.randn(300, 1000, device="cuda")
        s = torch.rand(300, device="cuda")
        line["matches_torch"] = bool(torch.equal(ext.scale_rows(x, s), x * s[:, None]))
    text = json.dumps(line)
    print(text, flush=True)
    (out / "cuda_ext_probe.jsonl").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
