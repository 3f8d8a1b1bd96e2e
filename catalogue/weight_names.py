"""The modules a model directory holds weights for, read from its safetensors headers (a JSON
head per file: no torch, no tensor read), for checking the names a fine-tuning job targets."""

from __future__ import annotations

import json
import struct
from pathlib import Path

MAX_HEADER = 100 << 20  # safetensors' own limit on a header


def module_names(directory: Path) -> frozenset[str]:
    """`model.layers.0.self_attn.q_proj` for `model.layers.0.self_attn.q_proj.weight`, of every
    safetensors file of the model (one, or the shards its index names); empty when none."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [directory / name for name in shards]
    else:
        files = [directory / "model.safetensors"]
    names: set[str] = set()
    for path in files:
        if path.exists():
            names.update(key.rpartition(".")[0] for key in _tensor_names(path))
    return frozenset(names)


def _tensor_names(path: Path) -> list[str]:
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        if size > MAX_HEADER:
            raise ValueError(f"{path} has a {size}-byte header: no safetensors file")
        return [k for k in json.loads(f.read(size)) if k != "__metadata__"]


def matches(name: str, target: str) -> bool:
    """Whether a target names the module `name` as peft matches a target module: the whole
    name or its last dotted parts."""
    return name == target or name.endswith("." + target)


def matching(names: frozenset[str], target: str) -> list[str]:
    """The modules of `names` that `target` names."""
    return [name for name in names if matches(name, target)]
