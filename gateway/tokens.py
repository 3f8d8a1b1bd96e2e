"""Token counts for upload validation, from the base model's tokenizer.json (no torch)."""

from __future__ import annotations

import json
from functools import cached_property

from tokenizers import Tokenizer

from catalogue.paths import local_path


class TextTokens:
    def __init__(self, model: str) -> None:
        self.model = model

    @cached_property
    def _path(self):
        return local_path(self.model)

    @cached_property
    def _tokenizer(self) -> Tokenizer | None:
        if self._path is None or not (self._path / "tokenizer.json").exists():
            return None
        return Tokenizer.from_file(str(self._path / "tokenizer.json"))

    @cached_property
    def _config(self) -> dict:
        return {} if self._path is None else json.loads((self._path / "config.json").read_text())

    @cached_property
    def max_context(self) -> int:
        config = self._config
        return int(config.get("max_position_embeddings") or config.get("n_positions") or 0)

    @cached_property
    def vocab_size(self) -> int:
        """The model's vocabulary (0: unknown here; the worker checks token ids then)."""
        return int(self._config.get("vocab_size") or 0)

    def count(self, text: str) -> int:
        tokenizer = self._tokenizer
        return len(tokenizer.encode(text, add_special_tokens=False).ids) if tokenizer else 0
