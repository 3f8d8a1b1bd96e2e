"""A safetensors checkpoint mapped, not read: each tensor is a view of the file's pages, so every
tenant process that reads the same public weights shares one copy through the OS page cache."""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


class MappedCheckpoint:
    """{tensor name: a read-only view} over a single-file or sharded safetensors checkpoint."""

    def __init__(self, path: Path) -> None:
        index = path / "model.safetensors.index.json"
        files = (sorted(set(json.loads(index.read_text())["weight_map"].values()))
                 if index.exists() else ["model.safetensors"])
        self._entries: dict[str, tuple[mmap.mmap, dict, int]] = {}
        for name in files:
            with (path / name).open("rb") as f:
                # a private copy-on-write mapping: a writable buffer for torch, the pages shared
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            length = struct.unpack("<Q", mapped[:8])[0]
            header = json.loads(mapped[8:8 + length])
            header.pop("__metadata__", None)
            for key, entry in header.items():
                self._entries[key] = (mapped, entry, 8 + length)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def keys(self) -> list[str]:
        return list(self._entries)

    def get(self, key: str) -> torch.Tensor:
        mapped, entry, base = self._entries[key]
        dtype = DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        count = (end - begin) // torch.empty((), dtype=dtype).element_size()
        flat = torch.frombuffer(mapped, dtype=dtype, count=count, offset=base + begin)
        return flat.view(entry["shape"])
