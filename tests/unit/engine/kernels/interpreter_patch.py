"""A fix for Triton 3.6's interpreter under NumPy 2.4, applied by the `*_interpreted.py` scripts only."""

from __future__ import annotations

from triton.runtime import interpreter


def index_scalars_as_numpy_2_4_allows() -> None:
    """Let kernels with a runtime loop bound run under the interpreter.

    Triton 3.6's interpreter holds scalars as 1-element arrays and turns them into loop bounds with
    `int(array)`, which NumPy 2.4 refuses for arrays of one dimension: a kernel loop with a runtime
    bound (the key blocks of a record) then fails under the interpreter alone. `.item()` does the same
    conversion for every NumPy version.
    """
    original = interpreter._patch_lang_tensor

    def patch(tensor: object, scope: interpreter._LangPatchScope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patch


def fp_downcasts_rounded_as_the_gpu_does() -> None:
    """Round float32 to e4m3 and to bf16 to nearest even, as the GPU's conversions do.

    Triton 3.6's interpreter truncates float32 to bf16 (`create_fp_trunc`), and rounds a downcast to e4m3
    (`create_fp_to_fp`) by adding the first dropped bit to the kept mantissa without carrying into the
    exponent (a value whose mantissa rounds up past all ones comes out halved) and without the sticky
    bits. This takes torch's conversion for float32 sources to those two types and leaves every other
    conversion to the interpreter.
    """
    import numpy as np
    import torch
    import triton.language as tl

    targets = {tl.float8e4nv: (torch.float8_e4m3fn, np.uint8), tl.bfloat16: (torch.bfloat16, np.uint16)}
    builder = interpreter.InterpreterBuilder

    def rounded(src: object, dst_type: object) -> object | None:
        dst = getattr(dst_type, "scalar", None)
        data = getattr(src, "data", None)
        if dst not in targets or not isinstance(data, np.ndarray) or data.dtype != np.float32:
            return None
        torch_dtype, stored = targets[dst]
        converted = torch.from_numpy(np.ascontiguousarray(data)).to(torch_dtype)
        bits = converted.view(torch.uint8 if stored is np.uint8 else torch.int16).numpy().view(stored)
        return interpreter.TensorHandle(bits.reshape(data.shape), dst)

    to_fp, trunc = builder.create_fp_to_fp, builder.create_fp_trunc

    def create_fp_to_fp(self: object, src: object, dst_type: object, rounding_mode: object) -> object:
        got = rounded(src, dst_type)
        return to_fp(self, src, dst_type, rounding_mode) if got is None else got

    def create_fp_trunc(self: object, src: object, dst_type: object) -> object:
        got = rounded(src, dst_type)
        return trunc(self, src, dst_type) if got is None else got

    builder.create_fp_to_fp = create_fp_to_fp  # type: ignore[method-assign]
    builder.create_fp_trunc = create_fp_trunc  # type: ignore[method-assign]
