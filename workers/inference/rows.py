"""Which adapter each row of a batch goes through, in a PeftModel of many LoRA adapters.

All rows of one adapter: that adapter is made the active one and the batch runs peft's plain
path. Rows of several (or of the base model): each row names its own (peft's mixed batches: the
rows of each adapter through its LoRA matrices alone, base-model rows through none). The names
reach each LoRA module as peft's `adapter_names` argument does, through a pre-forward hook, but
one installed once per module (again only when an adapter adds modules) that reads the current
forward's names: peft's argument walks every module twice a forward, to check the names and to
register hooks it then removes (a tenth of a mixed decode step of tiny-llama).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from peft.tuners.lora import LoraLayer
from peft.utils import AuxiliaryTrainingWrapper

BASE_MODEL_ROWS = "__base__"  # peft's adapter name for rows that use none


class RowAdapters:
    def __init__(self, model: Any = None) -> None:
        self.model = model  # None: a plain model or one adapter, nothing to choose
        self.active: str | None = None
        self.names: list[str] | None = None  # the current forward's rows, while it runs
        self._hooked: weakref.WeakSet = weakref.WeakSet()
        self._hooked_for: frozenset[str] = frozenset()  # the adapters the hooks were placed for
        self._handles: list[Any] = []

    def close(self) -> None:
        """Take the hooks off (the engine moves to another model, or to none)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._hooked = weakref.WeakSet()
        self._hooked_for = frozenset()

    @contextmanager
    def select(self, adapters: list[str | None]) -> Iterator[None]:
        """Around a forward over rows of `adapters` (None: the base model)."""
        if self.model is None:
            yield
            return
        first = adapters[0]
        if first is not None and all(a == first for a in adapters):
            if self.active != first:
                self.model.set_adapter(first)
                self.active = first
            yield
            return
        names = [a or BASE_MODEL_ROWS for a in adapters]
        unknown = set(names) - {BASE_MODEL_ROWS, *self.model.peft_config}
        if unknown:
            raise ValueError(f"no adapter named {', '.join(sorted(unknown))} in this model")
        self._hook_modules()
        self.names = names
        try:
            yield
        finally:
            self.names = None

    def _hook_modules(self) -> None:
        adapters = frozenset(self.model.peft_config)
        if adapters == self._hooked_for:
            return
        for module in self.model.modules():
            if isinstance(module, (LoraLayer, AuxiliaryTrainingWrapper)) and \
                    module not in self._hooked:
                self._handles.append(
                    module.register_forward_pre_hook(self._name_rows, with_kwargs=True))
                self._hooked.add(module)
        self._hooked_for = adapters

    def _name_rows(self, module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if self.names is None:
            return None
        return args, {**kwargs, "adapter_names": self.names}
