"""What the gateway checks requests against, from the base model's files (no torch): token
counts from its tokenizer.json, its context and vocabulary, its modules' names."""

from __future__ import annotations

import json
from functools import cached_property

from tokenizers import Tokenizer

from catalogue.paths import local_path
from catalogue.weight_names import module_names


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

    @cached_property
    def hidden_size(self) -> int:
        """An embedding's dimensions (0: unknown here; the worker checks `dimensions` then)."""
        config = self._config
        return int(config.get("hidden_size") or config.get("n_embd") or 0)

    @cached_property
    def modules(self) -> frozenset[str]:
        """The model's modules with weights (empty: unknown here; the trainer checks then)."""
        return frozenset() if self._path is None else module_names(self._path)

    def count(self, text: str) -> int:
        """Its tokens (0: no tokenizer here). `encode_batch`, as it lets go of the GIL while it
        works (`encode` holds it: a 2 MB text stopped every other thread for over a second)."""
        tokenizer = self._tokenizer
        if tokenizer is None:
            return 0
        encoded, = tokenizer.encode_batch([text], add_special_tokens=False)
        return len(encoded.ids)
