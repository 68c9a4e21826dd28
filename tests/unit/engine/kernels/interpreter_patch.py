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
