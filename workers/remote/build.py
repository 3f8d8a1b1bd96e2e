"""`remote_model`: a regular transformers model whose frozen layers run in the shared executor.

The model is built on the meta device, its frozen weight-bearing layers are swapped for remote
ones, then only what stays local (norms, rotary buffers, ...) is materialized: non-persistent
buffers are recomputed by the model's own initializer, other tensors are read from the checkpoint.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedModel
from transformers.pytorch_utils import Conv1D

from catalogue.base_layers import is_base_embedding, is_base_linear
from catalogue.resolve import resolve_model
from wire.call.messages import LayerKind, LayerSpec
from workers.remote.client import ExecutorClient
from workers.remote.fusion import FusedGroup
from workers.remote.handle import ExecutorHandle
from workers.remote.kept_rows import enable_kept_rows
from workers.remote.layers import RemoteConv1D, RemoteEmbedding, RemoteLayer, RemoteLinear
from workers.remote.loss import enable_head_loss
from workers.remote.mapped import MappedCheckpoint
from workers.remote.privacy import PrivacyConfig, PrivateExecutor, WeightSource, local_modules
from workers.remote.stretch import enable_stretches

log = logging.getLogger("workers.remote")


class ModelMismatch(ValueError):
    """The worker's model does not match the executor's."""


def remote_model(model: str | Path, executor: str | ExecutorHandle, *,
                 dtype: torch.dtype | None = None, device: str = "cpu", fuse: bool = True,
                 stretch: bool = True, train_stretch_rows: int | None = None,
                 train_kept: bool | None = None, privacy: bool | Any = False,
                 client_name: str = "worker", background: bool = False,
                 **config_kwargs: Any) -> PreTrainedModel:
    """Build `model` (built-in name or HF directory) with its base layers in `executor`.

    `executor` is an endpoint (ipc:// or tcp://) or a handle such as `LocalExecutor`.
    `privacy=True` (or a PrivacyConfig) masks every activation and gradient sent to the
    executor and keeps what would leak local (privacy.local_modules); it requires float32.
    `background=True` (a trainer's) makes every call to an endpoint a training call, the model's
    no-grad passes too (`ExecutorClient.background`).
    `config_kwargs` go to the model config (e.g. attn_implementation="eager").
    """
    path = resolve_model(model)
    handle: ExecutorHandle = executor
    if isinstance(executor, str):
        handle = ExecutorClient(executor, name=client_name, device=device, background=background)
    dtype = dtype or handle.dtype
    hf_config = AutoConfig.from_pretrained(path, **config_kwargs)
    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    local: set[str] = set()
    if privacy:
        if dtype != torch.float32:
            raise ValueError("privacy mode needs float32: masking is exact only in float32")
        config = privacy if isinstance(privacy, PrivacyConfig) else PrivacyConfig()
        handle = PrivateExecutor(handle, config, checkpoint_weights(net, path))
        local = local_modules(net, config)
    swap_base_layers(net, handle, dtype, torch.device(device), local=local)
    if fuse:
        fuse_groups(net, handle)
    # a stretch is not linear: privacy's masking cannot cover it
    if stretch and not privacy and enable_stretches(net, handle, dtype, train_stretch_rows,
                                                    train_kept):
        enable_kept_rows(net)  # the last stretch computes the kept logits' rows only
    if not privacy:  # the labels would reach the executor
        enable_head_loss(net, handle)
    materialize_local(net, path, dtype, torch.device(device))
    if privacy:
        handle.warm(called_layers(net))
    net.eval()
    net.name_or_path = str(path)
    if (path / "generation_config.json").exists():
        net.generation_config = GenerationConfig.from_pretrained(path)
    net.symbiosis_executor = handle
    return net


def called_layers(model: nn.Module) -> list[int]:
    """The executor layers a model's remote layers call (a fused group's, not its members')."""
    ids = set()
    for module in model.modules():
        if isinstance(module, RemoteLayer) and not isinstance(module, RemoteEmbedding):
            group = getattr(module, "fusion", None)
            ids.add(group.spec.index if group is not None else module.spec.index)
    return sorted(ids)


def swap_base_layers(model: nn.Module, handle: ExecutorHandle, dtype: torch.dtype,
                     device: torch.device, local: set[str] = frozenset()) -> int:
    """Swap every base layer but those named in `local` (read from the checkpoint instead)."""
    specs = {spec.name: spec for spec in handle.layers}
    swapped = 0
    for name, module in list(model.named_modules()):
        if not (is_base_linear(module) or is_base_embedding(module)) or name in local:
            continue
        spec = specs.get(name)
        _check(name, module, spec)
        if is_base_embedding(module):
            remote: nn.Module = RemoteEmbedding(spec, handle, dtype, device, module.padding_idx)
        elif isinstance(module, Conv1D):
            remote = RemoteConv1D(spec, handle, dtype, device)
        else:
            remote = RemoteLinear(spec, handle, dtype, device)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, remote)
        swapped += 1
    return swapped


def _check(name: str, module: nn.Module, spec: LayerSpec | None) -> None:
    if spec is None:
        raise ModelMismatch(f"the executor serves no layer {name!r}: is it running this model?")
    if is_base_embedding(module):
        expected = (LayerKind.EMBEDDING, module.num_embeddings, module.embedding_dim)
    elif isinstance(module, Conv1D):
        expected = (LayerKind.LINEAR, module.nx, module.nf)
    else:
        expected = (LayerKind.LINEAR, module.in_features, module.out_features)
    if (spec.kind, spec.in_features, spec.out_features) != expected:
        raise ModelMismatch(f"layer {name}: executor has {spec}, this model has {expected}")


def fuse_groups(model: nn.Module, handle: ExecutorHandle) -> int:
    modules = dict(model.named_modules())
    fused = 0
    for spec in handle.layers:
        if spec.kind != LayerKind.GROUP:
            continue
        members = [modules.get(name) for name in spec.members]
        if all(isinstance(m, RemoteLinear) for m in members):
            FusedGroup(spec, members)  # type: ignore[arg-type]
            fused += 1
    return fused


def materialize_local(model: nn.Module, path: Path, dtype: torch.dtype,
                      device: torch.device) -> None:
    """Give real values to everything still on the meta device: buffers recomputed, tensors
    mapped from the checkpoint (shared through the page cache while their dtype matches)."""
    owners = set()
    for name, buffer in list(model.named_buffers()):
        if buffer.is_meta:
            owner_name, _, leaf = name.rpartition(".")
            owner = model.get_submodule(owner_name)
            owner._buffers[leaf] = torch.empty_like(buffer, device=device)
            owners.add(owner_name)
    for owner_name in owners:  # transformers' initializer recomputes non-persistent buffers
        model._init_weights(model.get_submodule(owner_name))
    aliases: dict[int, list[str]] = {}  # tied weights: one tensor under several names
    for name, t in _named_local_tensors(model):
        if t.is_meta:
            aliases.setdefault(id(t), []).append(name)
    mapped = MappedCheckpoint(path)
    prefix = getattr(model, "base_model_prefix", "")
    for names in aliases.values():
        stored = next((n for n in names if _has_key(n, mapped, prefix)), names[0])
        stored_value = mapped.get(_checkpoint_key(stored, mapped, prefix))
        value = stored_value.to(device=device,
                                dtype=dtype if stored_value.is_floating_point() else None)
        shared = nn.Parameter(value, requires_grad=value.is_floating_point())
        for name in names:
            owner_name, _, leaf = name.rpartition(".")
            owner = model.get_submodule(owner_name)
            if leaf in owner._parameters:
                owner._parameters[leaf] = shared
            else:
                owner._buffers[leaf] = value
    left = [name for name, t in _named_local_tensors(model) if t.is_meta]
    if left:
        raise RuntimeError(f"tensors left on the meta device: {left[:5]}")


def checkpoint_weights(model: nn.Module, path: Path) -> WeightSource:
    """One base layer's weight, as [out, in], mapped from the checkpoint (tied weights followed)."""
    names = {id(m): name for name, m in model.named_modules()}
    tied: dict[str, str] = {}
    output, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if getattr(model.config, "tie_word_embeddings", False) and output is not None:
        tied[names[id(output)]] = names[id(embeddings)]
    conv1d = {name for name, m in model.named_modules() if isinstance(m, Conv1D)}
    prefix = getattr(model, "base_model_prefix", "")
    mapped = MappedCheckpoint(path)

    def weight(name: str) -> torch.Tensor:
        value = mapped.get(_checkpoint_key(f"{tied.get(name, name)}.weight", mapped, prefix))
        return value.t() if name in conv1d else value

    return weight


def _named_local_tensors(model: nn.Module):
    for name, module in model.named_modules():
        if isinstance(module, RemoteLayer):
            continue
        for leaf, p in module._parameters.items():
            if p is not None:
                yield (f"{name}.{leaf}" if name else leaf), p
        for leaf, b in module._buffers.items():
            if b is not None and leaf not in module._non_persistent_buffers_set:
                yield (f"{name}.{leaf}" if name else leaf), b


def _has_key(name: str, weight_map: Any, prefix: str) -> bool:
    try:
        _checkpoint_key(name, weight_map, prefix)
    except KeyError:
        return False
    return True


def _checkpoint_key(name: str, weight_map: Any, prefix: str) -> str:
    candidates = [name]
    if prefix and name.startswith(prefix + "."):
        candidates.append(name[len(prefix) + 1:])
    elif prefix:
        candidates.append(f"{prefix}.{name}")
    for key in candidates:
        if key in weight_map:
            return key
    raise KeyError(f"{name} is not in the checkpoint")
