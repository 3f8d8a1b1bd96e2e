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
    def max_context(self) -> int:
        if self._path is None:
            return 0
        config = json.loads((self._path / "config.json").read_text())
        return int(config.get("max_position_embeddings") or config.get("n_positions") or 0)

    def count(self, text: str) -> int:
        tokenizer = self._tokenizer
        return len(tokenizer.encode(text, add_special_tokens=False).ids) if tokenizer else 0
