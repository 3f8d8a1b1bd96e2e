"""A job's PEFT settings (the `peft` block of its spec) -> a peft config."""

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

from wire.jobs import PeftSpec


def peft_config(peft: PeftSpec, total_steps: int) -> PeftConfig:
    kind, targets = peft.method, peft.target_modules
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
