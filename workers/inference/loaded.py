"""A resident adapter (`Loaded`), and `InUse`: which of them a request is using.

A worker past its adapter budget asks of every resident adapter whether a request uses it, after
each engine step (`Adapters.settle`); `InUse` reads each engine's requests once for all of them,
where each adapter's own scan of the waiting, prefilling and running requests made a step's
settle cost (resident adapters x requests).
"""

from __future__ import annotations

from dataclasses import dataclass

from peft import PeftModel

from workers.inference.engine import InferenceEngine
from workers.inference.slots import Place


@dataclass(eq=False)
class Loaded:
    model: str  # the model id requests name (an adapter version)
    name: str  # its name inside the PeftModel
    engine: InferenceEngine
    shared: bool  # one of many in a PeftModel (rows name it): the LoRA adapters' or a group's
    tenant: str = ""
    bytes: int = 0  # what it holds resident (Budget.bytes)
    last_used: float = 0.0
    shape: str | None = None  # a shared adapter's: which others could take its place
    place: Place | None = None  # a shared adapter's tensors, once another took its place
    group: str | None = None  # an IA3 adapter's group (groups.py)
    prefill: PeftModel | None = None  # a prompt or prefix tuning adapter's model

    def busy(self, in_use: InUse | None = None) -> bool:
        in_use = in_use or InUse()
        if self.prefill is not None:
            return in_use.prefilling(self.engine, self.prefill)  # its prompts
        return self.name in in_use.adapters(self.engine) if self.shared \
            else self.engine.has_work()


class InUse:
    """What the requests of each engine asked about use, as they stand when first asked (one
    settle: nothing is added or stepped meanwhile)."""

    def __init__(self) -> None:
        self._adapters: dict[int, set[str]] = {}
        self._prefills: dict[int, set[int]] = {}

    def adapters(self, engine: InferenceEngine) -> set[str]:
        """The adapters that a waiting, prefilling or running request of `engine` names."""
        if id(engine) not in self._adapters:
            self._adapters[id(engine)] = engine.adapters_in_use()
        return self._adapters[id(engine)]

    def prefilling(self, engine: InferenceEngine, model: PeftModel) -> bool:
        """Whether a request waiting in `engine` is to be prefilled by `model`."""
        if id(engine) not in self._prefills:
            self._prefills[id(engine)] = {id(r.prefill) for r in engine.waiting}
        return id(model) in self._prefills[id(engine)]
