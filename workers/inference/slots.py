"""A LoRA (or IA3) adapter loaded into the place of an idle one of the same shape, or (while
there is room for one more) into a copy of a resident one's modules (`clone`).

Its tensors are copied over the other's: the LoRA modules, the name rows carry and the scaling
stay as they are, and nothing walks the model. peft's `load_adapter` walks the whole model
several times (injecting, casting, marking trainable, setting the active adapter) and its
`delete_adapter` again, each walk longer with every adapter resident: ~25 ms a cold load at 32
resident adapters of tiny-llama, where a copy over an idle adapter's place takes well under one.
The idea of S-LoRA's and LoRAX's adapter slots, without a fixed pool: any resident adapter is a
place for the next one of its shape.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from peft import PeftConfig, PeftModel
from peft.tuners.ia3 import IA3Layer
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file

WEIGHTS = "adapter_model.safetensors"
# what an adapter's config may differ in and still fit another's modules
METADATA = frozenset({"base_model_name_or_path", "revision", "inference_mode", "peft_version",
                      "auto_mapping"})

Place = dict[str, torch.Tensor]  # an adapter's tensors in the model, by their names in its file
LORA_PER_ADAPTER = frozenset(LoraLayer.adapter_layer_names + LoraLayer.other_param_names)
IA3_PER_ADAPTER = frozenset(IA3Layer.adapter_layer_names + IA3Layer.other_param_names)


def shape_of(path: Path) -> str:
    """What two adapters must share for one to take the other's place: the config, less
    metadata (target modules in any order)."""
    config = json.loads((path / "adapter_config.json").read_text())
    kept = {key: sorted(value) if key == "target_modules" and isinstance(value, list) else value
            for key, value in config.items() if key not in METADATA}
    return json.dumps(kept, sort_keys=True)


def place_of(model: PeftModel, name: str) -> Place:
    """Adapter `name`'s LoRA matrices (or IA3 vectors) in `model` under the names peft saves
    them by (detached: they share the parameters' storage and versions). An adapter with other
    tensors (embedding LoRA, modules to save) has a place no file fits: peft's own loader takes
    those."""
    place: Place = {}
    for path, module in model.named_modules():
        if (isinstance(module, LoraLayer) and name in module.lora_A) or \
                (isinstance(module, IA3Layer) and name in module.ia3_l):
            place.update(_layer_place(path, module, name))
    return place


def read_fitting(path: Path, place: Place) -> dict[str, torch.Tensor] | None:
    """The adapter's tensors at `path` if they fit `place` name for name, shape for shape; None
    when they do not (a file of another layout: peft's own loader takes it)."""
    file = path / WEIGHTS
    if not file.is_file():
        return None
    tensors = load_file(file)
    if tensors.keys() != place.keys() or \
            any(tensors[key].shape != place[key].shape for key in tensors):
        return None
    return tensors


def fill(place: Place, tensors: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for key, tensor in tensors.items():
            place[key].copy_(tensor)


def clone(model: PeftModel, source: str, place: Place, name: str,
          config: PeftConfig) -> Place | None:
    """Adapter `name` (of `config`) made in `model` as a copy of the modules of adapter
    `source`, of the same shape, whose tensors `place` holds: each of its LoRA (or IA3) layers is
    found by its path, not by a walk of the model. The new adapter's place, to `fill`; None, and
    nothing changed, when a layer keeps state of `source` this does not know to copy (peft's own
    loader takes the adapter then)."""
    paths = sorted({_layer_path(key) for key in place})
    layers = [model.get_submodule(path) for path in paths]
    for layer in layers:
        held = {key for key, value in (*vars(layer).items(), *layer._modules.items())
                if hasattr(value, "keys") and source in value}
        if not isinstance(layer, (LoraLayer, IA3Layer)) or held - _per_adapter(layer):
            return None
    for layer in layers:
        for key in _per_adapter(layer):
            container = getattr(layer, key, None)
            if container is not None and source in container:
                value = container[source]
                container[name] = copy.deepcopy(value) \
                    if isinstance(value, (torch.nn.Module, torch.Tensor)) else value
    model.peft_config[name] = config
    return {key: tensor for path, layer in zip(paths, layers, strict=True)
            for key, tensor in _layer_place(path, layer, name).items()}


def _layer_place(path: str, layer: torch.nn.Module, name: str) -> Place:
    """Adapter `name`'s tensors in one LoRA or IA3 layer at `path`, as `place_of` names them."""
    if isinstance(layer, IA3Layer):
        return {f"{path}.ia3_l": layer.ia3_l[name].detach()}
    return {f"{path}.{matrix}.{kind}": tensor.detach() for matrix in ("lora_A", "lora_B")
            for kind, tensor in getattr(layer, matrix)[name].named_parameters()}


def _layer_path(key: str) -> str:
    return key.removesuffix(".ia3_l") if key.endswith(".ia3_l") else key.rsplit(".lora_", 1)[0]


def _per_adapter(layer: torch.nn.Module) -> frozenset[str]:
    return LORA_PER_ADAPTER if isinstance(layer, LoraLayer) else IA3_PER_ADAPTER
