"""Where a stretch's modules sit in a model, and a per-call check that adapters left them alone
(what `workers.remote.stretch` and `workers.remote.tail` check before each call); where what a
stretch or the lead computes ahead goes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from wire.call.messages import LayerSpec

Place = tuple[dict, str, nn.Module, bool]  # a parent's _modules, the name, the module, a leaf


def places(root: nn.Module, paths: list[str]) -> list[Place]:
    """Where each module on the way to each path sits (once each), for `untouched`."""
    found: dict[int, Place] = {}
    for path in paths:
        parent, names = root, path.split(".")
        for i, name in enumerate(names):
            child = parent._modules[name]
            leaf = i == len(names) - 1 or (id(child) in found and found[id(child)][3])
            found[id(child)] = (parent._modules, name, child, leaf)
            parent = child
    return list(found.values())


def untouched(where: list[Place]) -> bool:
    """Each module still sits where it was and no adapter hooks the stretch's own modules: a
    dict lookup per module, not a walk per path (get_submodule: ~4 us a path)."""
    for modules, name, module, leaf in where:
        hooked = leaf and bool(module._forward_hooks or module._forward_pre_hooks)
        if hooked or modules.get(name) is not module:
            return False
    return True


def staged_targets(spec: LayerSpec, specs: dict[str, LayerSpec],
                   modules: dict[str, nn.Module]) -> list[nn.Module]:
    """The modules that take what a stretch or the lead `spec` computes ahead, in its output's
    order: its members after the first, each a fused group (its layers) or a layer itself."""
    return [modules[name] for member in spec.members[1:]
            for name in (specs[member].members or (member,))]


@dataclass(slots=True)
class Ahead:
    """What a stretch or the lead computed ahead from the output it returned: that output's norm
    and what the layers after it (`targets`) take from the norm (q/k/v, or the logits)."""

    output: torch.Tensor
    version: int
    normed: torch.Tensor
    targets: Sequence[nn.Module]
    results: Sequence[torch.Tensor]

    @classmethod
    def of(cls, output: torch.Tensor, normed: torch.Tensor, targets: Sequence[nn.Module],
           results: Sequence[torch.Tensor], owned: bool = False) -> Ahead:
        """`normed` as a tensor of its own unless it is one (`owned`): a view of the call's
        result shares its version counter with the q/k/v beside it, so an adapter adding to q
        in place (peft's mixed-adapter batches do) would make the staged k and v look stale."""
        return cls(output, output._version, normed if owned else normed.clone(), targets,
                   results)

    def hand_over(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """The norm, with the results staged on their layers, if `hidden_states` is the output
        it was computed from, unchanged since (a hook may change it in place); else None."""
        if hidden_states is not self.output or hidden_states._version != self.version:
            return None
        for target, result in zip(self.targets, self.results, strict=True):
            target.stage.put(self.normed, result)
        return self.normed
