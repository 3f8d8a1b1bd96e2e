"""An adapter's tensors against its PEFT config and the base model, before it is stored: every
tensor is one the method makes, for a module the base model has, with the shapes that module
and the config imply. A file that passes loads into peft; one that would fail, or silently
serve the base model, is refused here with the reason."""

from __future__ import annotations

import re

from catalogue.weight_names import matches
from wire.jobs import ALL_LINEAR
from workers.manager.tensorfile import Shapes

PREFIX = "base_model.model."
LORA = re.compile(r"(?P<module>.+)\.(?P<part>lora_A|lora_B|lora_embedding_A|lora_embedding_B"
                  r"|base_layer)(?:\.weight)?$")
IA3 = re.compile(r"(?P<module>.+)\.ia3_l$")
ADALORA = re.compile(r"(?P<module>.+)\.(?P<part>lora_A|lora_B|lora_E|ranknum)(?:\.weight)?$")
PATTERNS = {"LORA": LORA, "IA3": IA3, "ADALORA": ADALORA}


class AdapterMismatch(ValueError):
    pass


def check(peft_type: str, config: dict, tensors: Shapes, base: Shapes | None) -> None:
    """AdapterMismatch unless `tensors` fit `config` and (when known) the base's `base`."""
    if peft_type in ("PROMPT_TUNING", "PREFIX_TUNING"):
        _virtual_tokens(peft_type, config, tensors)
        return
    targets = _named_targets(config)
    modules = set()
    for key, shape in tensors.items():
        module_key = key.removeprefix(PREFIX)
        match = PATTERNS[peft_type].fullmatch(module_key)
        if match is None:
            raise AdapterMismatch(f"tensor {key!r} is not one a {peft_type} adapter has")
        weight = _base_weight(match["module"], base) if base is not None else None
        modules.add(match["module"])
        if targets is not None and not any(matches(match["module"], t) for t in targets):
            raise AdapterMismatch(f"tensor {key!r} is for {match['module']}, which the "
                                  f"config's target_modules ({_some(targets)}) do not name: "
                                  "peft would leave it out")
        if peft_type == "LORA":
            _lora(key, match["module"], match["part"], shape, weight, config, tensors)
        elif peft_type == "IA3" and weight is not None:
            _ia3(key, match["module"], shape, weight, config)
    if targets is not None and base is not None:
        _every_target_has_weights(targets, modules, base)


def _named_targets(config: dict) -> list[str] | None:
    """The config's target_modules where they are names that select every module they match
    (a regular expression, `all-linear`, excluded modules or chosen layers: None, unchecked)."""
    targets = config.get("target_modules")
    if not isinstance(targets, list) or ALL_LINEAR in targets or \
            not all(isinstance(t, str) for t in targets) or \
            any(config.get(key) for key in ("exclude_modules", "layers_to_transform")):
        return None
    return sorted(targets)


def _some(names: list[str], shown: int = 4) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _every_target_has_weights(targets: list[str], modules: set[str], base: Shapes) -> None:
    """A module the config targets and the file holds no weights for would serve as the base
    model's (peft starts it at zero and only warns)."""
    for name, shape in base.items():
        module = name.removesuffix(".weight")
        if len(shape) == 2 and module not in modules and any(matches(module, t)
                                                             for t in targets):
            raise AdapterMismatch(f"the config's target_modules name {module}, and the file "
                                  "holds no weights for it: the adapter would serve it "
                                  "unchanged")


def _base_weight(module: str, base: Shapes) -> tuple[int, ...]:
    for name in (f"{module}.weight", f"{module}.base_layer.weight"):
        if name in base:
            return base[name]
    if module.endswith("lm_head"):  # tied to the input embeddings
        tied = next((shape for name, shape in base.items()
                     if name.endswith(("embed_tokens.weight", "wte.weight"))), None)
        if tied is not None:
            return tied
    raise AdapterMismatch(f"the adapter targets {module!r}, which the base model does not have")


def _in_out(weight: tuple[int, ...], config: dict, embedding: bool) -> tuple[int, int]:
    if embedding or config.get("fan_in_fan_out"):  # [rows, dim] / Conv1D's [in, out]
        return weight[0], weight[1]
    return weight[1], weight[0]


def _lora(key: str, module: str, part: str, shape: tuple[int, ...],
          weight: tuple[int, ...] | None, config: dict, tensors: Shapes) -> None:
    if len(shape) != 2:
        raise AdapterMismatch(f"tensor {key!r} has shape {list(shape)}, not a matrix")
    if part == "base_layer":
        if weight is not None and shape != weight:
            raise AdapterMismatch(f"tensor {key!r} has shape {list(shape)}; the base model's "
                                  f"is {list(weight)}")
        return
    rank = shape[0] if part.endswith("A") else shape[1]
    expected = (config.get("rank_pattern") or {}) or config.get("r")
    if isinstance(expected, int) and rank != expected:
        raise AdapterMismatch(f"tensor {key!r} has rank {rank}; the config says r={expected}")
    if weight is None:
        return
    fan_in, fan_out = _in_out(weight, config, part.startswith("lora_embedding"))
    wanted = (rank, fan_in) if part.endswith("A") else (fan_out, rank)
    if shape != wanted:
        raise AdapterMismatch(f"tensor {key!r} has shape {list(shape)}; {module} of the base "
                              f"model needs {list(wanted)}")


def _ia3(key: str, module: str, shape: tuple[int, ...], weight: tuple[int, ...],
         config: dict) -> None:
    fan_in, fan_out = _in_out(weight, config, False)
    feedforward = any(matches(module, m) for m in config.get("feedforward_modules") or [])
    wanted = (1, fan_in) if feedforward else (fan_out, 1)
    if shape != wanted:
        raise AdapterMismatch(f"tensor {key!r} has shape {list(shape)}; {module} of the base "
                              f"model needs {list(wanted)}")


def _virtual_tokens(peft_type: str, config: dict, tensors: Shapes) -> None:
    if set(tensors) != {"prompt_embeddings"}:
        raise AdapterMismatch(f"a {peft_type} adapter holds exactly 'prompt_embeddings', not "
                              f"{sorted(tensors)}")
    shape = tensors["prompt_embeddings"]
    tokens, dim = config.get("num_virtual_tokens"), config.get("token_dim")
    if peft_type == "PREFIX_TUNING" and isinstance(dim, int):
        dim = dim * 2 * int(config.get("num_layers") or 0)
    if len(shape) != 2 or (isinstance(tokens, int) and shape[0] != tokens) or \
            (isinstance(dim, int) and shape[1] != dim):
        raise AdapterMismatch(f"prompt_embeddings has shape {list(shape)}; the config needs "
                              f"[{tokens}, {dim}]")
