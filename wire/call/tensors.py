"""Tensors as raw bytes: dtype names on the wire, views over frames and shared memory."""

from __future__ import annotations

import math
import warnings

import torch

# Frames received from ZeroMQ are read-only buffers; the tensors over them are only ever read.
warnings.filterwarnings("ignore", message="The given buffer is not writable")

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
}
NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
ALIGN = 64
TOKEN_BYTES = 16  # the random token a client writes at the start of memory it shares


def dtype_of(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r} (supported: {', '.join(DTYPES)})") from None


def name_of(dtype: torch.dtype) -> str:
    try:
        return NAMES[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype}") from None


def nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * dtype.itemsize


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def as_bytes(t: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a contiguous CPU tensor (bfloat16 included)."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.device.type != "cpu":
        t = t.cpu()
    return memoryview(t.view(torch.uint8).reshape(-1).numpy())


def from_bytes(buffer: memoryview | bytes | bytearray, dtype: torch.dtype,
               shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor over `buffer` (no copy); raises ValueError when the sizes disagree."""
    expected = nbytes(dtype, shape)
    size = memoryview(buffer).nbytes
    if size != expected:
        raise ValueError(f"tensor frame has {size} bytes, shape {list(shape)} needs {expected}")
    if expected == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).view(shape)
