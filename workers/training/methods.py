"""A job's PEFT method settings (the `peft` block of a job) -> a peft config."""

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

BASE_LEARNING_RATE = {"lora": 2e-4, "adalora": 2e-4, "ia3": 1e-3, "prefix_tuning": 1e-3,
                      "prompt_tuning": 1e-3}


def peft_config(method: dict, total_steps: int) -> PeftConfig:
    kind = method["type"]
    targets = method.get("target_modules")
    if kind == "lora":
        return LoraConfig(task_type=TaskType.CAUSAL_LM, r=method["r"], lora_alpha=method["alpha"],
                          lora_dropout=method["dropout"], target_modules=targets or "all-linear")
    if kind == "adalora":
        return AdaLoraConfig(task_type=TaskType.CAUSAL_LM, init_r=method["r"],
                             target_r=max(1, method["r"] // 2), lora_alpha=method["alpha"],
                             lora_dropout=method["dropout"], target_modules=targets,
                             total_step=max(total_steps, 2), tinit=0, tfinal=0)
    if kind == "ia3":
        return IA3Config(task_type=TaskType.CAUSAL_LM, target_modules=targets,
                         feedforward_modules=method.get("feedforward_modules"))
    if kind == "prefix_tuning":
        return PrefixTuningConfig(task_type=TaskType.CAUSAL_LM,
                                  num_virtual_tokens=method["num_virtual_tokens"])
    if kind == "prompt_tuning":
        return PromptTuningConfig(task_type=TaskType.CAUSAL_LM,
                                  num_virtual_tokens=method["num_virtual_tokens"])
    raise ValueError(f"unknown PEFT method {kind!r}")
