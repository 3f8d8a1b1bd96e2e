"""Which adapter each row of a batch goes through, in a PeftModel of many LoRA adapters (or of
many IA3 adapters: each row scaled by its own, ia3_rows.py).

All rows of one adapter: that adapter is made the active one and the batch runs peft's plain
path. Rows of several (or of the base model): each row goes through its own adapter's LoRA
matrices alone, base-model rows through none. Each LoRA module's forward is wrapped once (again
only when an adapter adds modules) and reads the current forward's rows: a plain LoRA Linear
adds every row's delta in two matmuls (lora_rows.py), any other module takes peft's
`adapter_names` path with the rows' names. Passing peft's argument to the model instead walks
every module twice a forward, to check the names and to register hooks it then removes (a tenth
of a mixed decode step of tiny-llama), and loops over the adapters in every module. In a packed
step (`packed.py`) the rows are the positions of one sequence (`select(..., by_position=True)`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from peft.tuners.ia3 import IA3Layer
from peft.tuners.lora import LoraLayer
from peft.utils import AuxiliaryTrainingWrapper
from torch import nn

from workers.inference import ia3_rows
from workers.inference.lora_rows import RowPlan, Stacks, forward_rows

BASE_MODEL_ROWS = "__base__"  # peft's adapter name for rows that use none


class RowAdapters:
    def __init__(self, model: Any = None) -> None:
        self.model = model  # None: a plain model or one adapter, nothing to choose
        self.active: str | None = None
        self.plan: RowPlan | None = None  # the current forward's rows, while it runs
        self.stacks = Stacks()
        # module -> (our forward, the instance forward it replaced or None)
        self._wrapped: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._wrapped_for: tuple = ()  # the adapters (name, config) the wrapping was done for

    def close(self) -> None:
        """Unwrap every module (the engine moves to another model, or to none)."""
        for module, (forward, before) in list(self._wrapped.items()):
            if module.__dict__.get("forward") is forward:
                del module.forward
                if before is not None:
                    module.forward = before
        self._wrapped = weakref.WeakKeyDictionary()
        self._wrapped_for = ()
        self.stacks.clear()

    def tunes_head(self) -> bool:
        """Whether an adapter's module wraps the model's head (which sees only the positions
        whose logits are kept)."""
        head = None if self.model is None else self.model.get_output_embeddings()
        return isinstance(head, (LoraLayer, IA3Layer, AuxiliaryTrainingWrapper))

    @contextmanager
    def select(self, adapters: list[str | None], by_position: bool = False) -> Iterator[None]:
        """Around a forward over rows of `adapters` (None: the base model); `by_position`: a
        forward of one sequence whose positions are those rows (a packed step)."""
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
        self._wrap_modules()
        self.plan = RowPlan(names, BASE_MODEL_ROWS, by_position)
        try:
            yield
        finally:
            self.plan = None

    def _wrap_modules(self) -> None:
        adapters = tuple(self.model.peft_config.items())
        if len(adapters) == len(self._wrapped_for) and all(
                name == was and config is config_was
                for (name, config), (was, config_was) in zip(adapters, self._wrapped_for,
                                                              strict=True)):
            return
        self.stacks.clear()  # an adapter left or came back under its name: nothing stale stays
        for module in tuner_layers(self.model):
            if module not in self._wrapped:
                forward = self._rows_forward(module)
                self._wrapped[module] = (forward, module.__dict__.get("forward"))
                module.forward = forward
        self._wrapped_for = adapters

    def _rows_forward(self, module: Any) -> Any:
        peft_forward = module.forward
        rows = weakref.ref(self)  # the module must not keep a closed RowAdapters alive

        def forward(x: Any, *args: Any, **kwargs: Any) -> Any:
            owner = rows()
            plan = owner.plan if owner is not None else None
            if plan is None:
                return peft_forward(x, *args, **kwargs)
            if isinstance(module, IA3Layer):
                if not ia3_rows.qualifies(module):
                    raise ValueError(f"{type(module).__name__} serves one IA3 adapter a batch")
                return ia3_rows.forward_rows(module, x, plan, *args, **kwargs)
            stacks = owner.stacks
            stacked = None if kwargs else stacks.of(module, plan)
            if stacked is None and plan.dim:  # peft's rows lie along the first dimension
                return peft_forward(x.transpose(0, 1), *args, adapter_names=plan.names,
                                    **kwargs).transpose(0, 1)
            if stacked is None:
                return peft_forward(x, *args, adapter_names=plan.names, **kwargs)
            factor = stacks.factor(stacked, plan) if stacked.layout else None
            return forward_rows(module, x, stacked, factor, *args, rows_dim=plan.dim)
        return forward


def tuner_layers(module: nn.Module) -> Iterator[nn.Module]:
    """The tuner layers under `module` (LoRA, IA3, modules to save), found without entering a
    LoRA or IA3 layer: what those hold grows with every adapter resident, the layers do not."""
    for child in module.children():
        if isinstance(child, (LoraLayer, IA3Layer)):
            yield child
            continue
        if isinstance(child, AuxiliaryTrainingWrapper):
            yield child
        yield from tuner_layers(child)
