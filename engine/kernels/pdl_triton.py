"""The Triton side of `engine.kernels.pdl`: what a PDL-launched kernel runs before touching global memory.

Checked without `disallow_untyped_defs`, as the other Triton modules (pyproject.toml).
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def after_previous(pdl: tl.constexpr):
    # With `pdl`: wait for the previous grid to finish with its writes visible, then let the next grid be
    # scheduled (its programs wait at this same call). Without it nothing is emitted (CPU interpreter).
    if pdl:
        gdc_wait()
        gdc_launch_dependents()
