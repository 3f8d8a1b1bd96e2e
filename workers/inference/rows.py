"""Which adapter each row of a batch goes through, in a PeftModel of many LoRA adapters.

All rows of one adapter: that adapter is made the active one and the batch runs peft's plain
path. Rows of several (or of the base model): each row names its own (peft's mixed batches: the
rows of each adapter through its LoRA matrices alone, base-model rows through none).
"""

from __future__ import annotations

from typing import Any

BASE_MODEL_ROWS = "__base__"  # peft's adapter name for rows that use none


class RowAdapters:
    def __init__(self, model: Any = None) -> None:
        self.model = model  # None: a plain model or one adapter, nothing to choose
        self.active: str | None = None

    def kwargs(self, adapters: list[str | None]) -> dict[str, list[str]]:
        """The forward's keyword arguments for rows of `adapters` (None: the base model)."""
        if self.model is None:
            return {}
        first = adapters[0]
        if first is not None and all(a == first for a in adapters):
            if self.active != first:
                self.model.set_adapter(first)
                self.active = first
            return {}
        return {"adapter_names": [a or BASE_MODEL_ROWS for a in adapters]}
