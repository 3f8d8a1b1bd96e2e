"""Where models live on disk, without importing torch (the gateway uses this)."""

from __future__ import annotations

import os
from pathlib import Path


def model_cache_dir() -> Path:
    root = os.environ.get("SYMBIOSIS_MODEL_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "symbiosis" / "models"


def local_path(name_or_path: str | Path) -> Path | None:
    """The model's directory if it exists already (a given directory, or an exported built-in)."""
    path = Path(name_or_path).expanduser()
    if (path / "config.json").exists():
        return path.resolve()
    cached = model_cache_dir() / str(name_or_path)
    return cached if (cached / "model.safetensors").exists() else None
