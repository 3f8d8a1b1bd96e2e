"""A job's PEFT settings (the `peft` block of its spec) -> a peft config, and how its model keeps
activations for the backward (its gradient_checkpointing)."""

from __future__ import annotations

from peft import (
    AdaLoraConfig,
    IA3Config,
    LoraConfig,
    PeftConfig,
    PrefixTuningConfig,
    PromptTuningConfig,
    TaskType,
)
from torch import nn

from wire.jobs import ALL_LINEAR, PeftSpec
from workers.training.lean import keep_less


def peft_config(peft: PeftSpec, total_steps: int) -> PeftConfig:
    kind, targets = peft.method, peft.target_modules
    targets = ALL_LINEAR if targets == [ALL_LINEAR] else targets  # peft's word, as a list
    if kind == "lora":
        return LoraConfig(task_type=TaskType.CAUSAL_LM, r=peft.r, lora_alpha=peft.alpha,
                          lora_dropout=peft.dropout, target_modules=targets or "all-linear")
    if kind == "adalora":
        return AdaLoraConfig(task_type=TaskType.CAUSAL_LM, init_r=peft.r,
                             target_r=max(1, peft.r // 2), lora_alpha=peft.alpha,
                             lora_dropout=peft.dropout, target_modules=targets,
                             total_step=max(total_steps, 2), tinit=0, tfinal=0)
    if kind == "ia3":
        return IA3Config(task_type=TaskType.CAUSAL_LM, target_modules=targets,
                         feedforward_modules=peft.feedforward_modules)
    if kind == "prefix_tuning":
        return PrefixTuningConfig(task_type=TaskType.CAUSAL_LM,
                                  num_virtual_tokens=peft.num_virtual_tokens)
    if kind == "prompt_tuning":
        return PromptTuningConfig(task_type=TaskType.CAUSAL_LM,
                                  num_virtual_tokens=peft.num_virtual_tokens)
    raise ValueError(f"unknown PEFT method {kind!r}")


def recompute_layers(model: nn.Module) -> None:
    """Keep only each decoder layer's input for the backward pass and run the layer again there
    (transformers' gradient checkpointing, non-reentrant: the remote layers are called again,
    which the executor answers like any call). The gradients equal those without it."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    options = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.23's name
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)


def keep_for_backward(model: nn.Module, recompute: bool) -> None:
    """What a trainer's model keeps for the backward: with `recompute`, each decoder layer's
    input only (`recompute_layers`); otherwise all but what elementwise work on kept tensors
    makes again (`lean.keep_less`). Gradients are the same either way."""
    if recompute:
        recompute_layers(model)
    else:
        keep_less(model)
