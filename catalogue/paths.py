"""Where models live on disk, without importing torch (the gateway uses this)."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class CacheSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SYMBIOSIS_", extra="ignore", frozen=True)

    model_cache: Path | None = None  # SYMBIOSIS_MODEL_CACHE: where built-ins are exported
    cache_home: Path = Field(Path.home() / ".cache",
                             validation_alias=AliasChoices("XDG_CACHE_HOME"))


def model_cache_dir() -> Path:
    settings = CacheSettings()
    return settings.model_cache or settings.cache_home / "symbiosis" / "models"


def local_path(name_or_path: str | Path) -> Path | None:
    """The model's directory if it exists already (a given directory, or an exported built-in)."""
    path = Path(name_or_path).expanduser()
    if (path / "config.json").exists():
        return path.resolve()
    cached = model_cache_dir() / str(name_or_path)
    return cached if (cached / "model.safetensors").exists() else None
