"""IA3 adapters of one config served together: one PeftModel over a base model of their own
(IA3 wraps the modules it scales, so it cannot share the LoRA adapters' model), one engine, and
each row of a batch scaled by its own adapter's vectors (ia3_rows.py). A resident IA3 adapter
then holds its vectors only, where an engine of its own held a whole model's local part."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from peft import PeftConfig, PeftModel
from torch import nn

from workers.inference.budget import tensor_bytes
from workers.inference.engine import InferenceEngine
from workers.inference.slots import shape_of


def batch_family(path: Path) -> str | None:
    """Which adapters one of this config shares a batch with: "lora" (any LoRA adapter but DoRA:
    the shared model), "ia3" (IA3 adapters of the same config: a group), "prompt" (prompt and
    prefix tuning: their own prompt forward, then rows of the base model), or None (a method
    that reads the base weights or reallocates ranks: an engine of its own)."""
    config = json.loads((path / "adapter_config.json").read_text())
    kind = config.get("peft_type")
    if kind == "LORA" and not config.get("use_dora", False):
        return "lora"
    return {"IA3": "ia3", "PROMPT_TUNING": "prompt", "PREFIX_TUNING": "prompt"}.get(kind)


def read_adapter(peft: PeftModel, name: str, path: Path, device: str) -> None:
    """The adapter's tensors into its modules: all of them (modules made without memory,
    `low_cpu_mem_usage`, would serve whatever a missing tensor's memory held)."""
    loaded = peft.load_adapter(path, adapter_name=name, torch_device=device,
                               low_cpu_mem_usage=True)
    missing = [key.replace(f".{name}.", ".") for key in loaded.missing_keys
               if f".{name}." in key or key.endswith(f".{name}")]
    if missing:
        raise ValueError(f"the adapter's file lacks {len(missing)} of its tensors, "
                         f"e.g. {missing[0]}")


@dataclass
class Group:
    peft: PeftModel
    engine: InferenceEngine


class Groups:
    def __init__(self, make_engine: Callable[[nn.Module], InferenceEngine],
                 build_base: Callable[[], nn.Module], device: str) -> None:
        self.make_engine, self.build_base, self.device = make_engine, build_base, device
        self.groups: dict[str, Group] = {}  # by config (slots.shape_of)

    def model(self, key: str) -> PeftModel:
        return self.groups[key].peft

    def engines(self) -> list[InferenceEngine]:
        return [group.engine for group in self.groups.values()]

    def load(self, name: str, path: Path) -> tuple[InferenceEngine, str, int]:
        """Adapter `name` into its config's group (started for it if none): (the group's
        engine, its key, the bytes the adapter holds)."""
        key = shape_of(path)
        group = self.groups.get(key)
        if group is None:
            base = self.build_base()
            peft = PeftModel(base, PeftConfig.from_pretrained(path), adapter_name=name,
                             low_cpu_mem_usage=True).eval()
            read_adapter(peft, name, path, self.device)  # a failure leaves no group behind
            engine = self.make_engine(base)
            engine.use(peft, mixed=True)
            group = self.groups[key] = Group(peft, engine)
        else:
            try:
                read_adapter(group.peft, name, path, self.device)
            except Exception:
                if name in group.peft.peft_config:
                    group.peft.delete_adapter(name)
                raise
        held = [p for n, p in group.peft.named_parameters() if n.endswith(f".{name}")]
        return group.engine, key, tensor_bytes(held)

    def delete(self, key: str, name: str) -> None:
        """Adapter `name` out of its group; the group goes with its last adapter."""
        group = self.groups[key]
        if len(group.peft.peft_config) == 1:
            del self.groups[key]
        else:
            group.peft.delete_adapter(name)
