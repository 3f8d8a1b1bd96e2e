"""A safetensors file's table of tensors, read strictly and without torch (the gateway checks
uploads with it): the header must be a JSON object of well-formed entries whose byte ranges lie
inside the file, match their dtype and shape, and together cover the data exactly."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

MAX_HEADER = 100 * 2**20
ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
            "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}

Shapes = dict[str, tuple[int, ...]]


class TensorFileError(ValueError):
    pass


def read_shapes(path: Path) -> Shapes:
    """{tensor name: shape} of a safetensors file; TensorFileError saying what is wrong."""
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise TensorFileError(f"{path.name} is too short to be a safetensors file")
        length = struct.unpack("<Q", prefix)[0]
        if length > MAX_HEADER or 8 + length > size:
            raise TensorFileError(f"{path.name} is not a safetensors file (header of {length} "
                                  f"bytes in a file of {size})")
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise TensorFileError(f"{path.name}: its header is not JSON") from None
    if not isinstance(header, dict):
        raise TensorFileError(f"{path.name}: its header is not a JSON object")
    header.pop("__metadata__", None)
    return _entries(path.name, header, size - 8 - length)


def _entries(name: str, header: dict, data_bytes: int) -> Shapes:
    shapes: Shapes = {}
    ranges = []
    for key, entry in header.items():
        if not isinstance(entry, dict) or entry.get("dtype") not in ITEMSIZE or \
                not _ints(entry.get("shape")) or not _ints(entry.get("data_offsets")) or \
                len(entry["data_offsets"]) != 2:
            raise TensorFileError(f"{name}: tensor {key!r} is not a well-formed entry")
        shape, (begin, end) = tuple(entry["shape"]), entry["data_offsets"]
        count = math.prod(shape)
        if count == 0:
            raise TensorFileError(f"{name}: tensor {key!r} is empty (shape {list(shape)})")
        if not 0 <= begin <= end <= data_bytes or end - begin != count * ITEMSIZE[entry["dtype"]]:
            raise TensorFileError(f"{name}: tensor {key!r}'s bytes do not match its shape and "
                                  "dtype or lie outside the file")
        shapes[key] = shape
        ranges.append((begin, end))
    if not shapes:
        raise TensorFileError(f"{name} holds no tensors")
    covered = 0
    for begin, end in sorted(ranges):
        if begin != covered:
            raise TensorFileError(f"{name}: its tensors overlap or leave gaps")
        covered = end
    if covered != data_bytes:
        raise TensorFileError(f"{name}: {data_bytes - covered} bytes follow the last tensor")
    return shapes


def _ints(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool)
                                           and v >= 0 for v in value)


def model_shapes(directory: Path) -> Shapes:
    """Every weight's shape of a Hugging Face model directory (one file or sharded)."""
    index = directory / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) \
        if index.exists() else ["model.safetensors"]
    shapes: Shapes = {}
    for file in files:
        shapes.update(read_shapes(directory / file))
    return shapes
