"""The header of one safetensors shard: every tensor's dtype, shape and absolute byte range in the file.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
(`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`, offsets relative to the
end of the header), then the tensor bytes. The `safetensors` package reads such files but does not expose
where a tensor's bytes lie, which the release reader (`engine.model.release_read`) needs to read byte ranges
straight into pinned buffers; this module reads the header alone and validates it, touching no tensor data.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

MAX_HEADER_BYTES = 100 << 20
"""The safetensors format's own limit on the JSON header (100 MB)."""

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
"""safetensors dtype names this reader accepts."""


class HeaderError(ValueError):
    """The file is not a well-formed safetensors file; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class StoredTensor:
    """One tensor as stored: `nbytes` bytes from absolute file offset `offset`, row-major `shape`."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _entry(name: str, raw: object, data_start: int, file_size: int) -> StoredTensor:
    if not isinstance(raw, dict):
        raise HeaderError(f"{name}: header entry is not an object")
    dtype = DTYPES.get(str(raw.get("dtype")))
    shape, offsets = raw.get("shape"), raw.get("data_offsets")
    if dtype is None:
        raise HeaderError(f"{name}: unsupported dtype {raw.get('dtype')!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise HeaderError(f"{name}: bad shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise HeaderError(f"{name}: bad data_offsets {offsets!r}")
    begin, end = offsets
    if end - begin != math.prod(shape) * dtype.itemsize:
        raise HeaderError(f"{name}: {end - begin} bytes stored for shape {shape} of {raw.get('dtype')}")
    if data_start + end > file_size:
        raise HeaderError(
            f"{name}: data ends at byte {data_start + end}, past the end of the file ({file_size})"
        )
    return StoredTensor(name, dtype, tuple(shape), data_start + begin, end - begin)


def read_header(path: Path) -> dict[str, StoredTensor]:
    """Every tensor of the shard at `path`, by name (blocking: reads 8 + N bytes).

    Raises `HeaderError` for a file too short, a header that is not the safetensors JSON, an unknown dtype, a
    byte range that disagrees with dtype x shape or lies past the end of the file; `OSError` when unreadable.
    """
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) != 8:
            raise HeaderError(f"{size} bytes: too short for a safetensors header")
        length = int.from_bytes(head, "little")
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise HeaderError(f"header length {length} does not fit the file ({size} bytes)")
        text = f.read(length)
    try:
        header = json.loads(text)
    except ValueError as exc:
        raise HeaderError(f"header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise HeaderError("header is not a JSON object")
    start = 8 + length
    return {
        str(name): _entry(str(name), raw, start, size)
        for name, raw in header.items()
        if name != "__metadata__"
    }
