"""The benchmark client's model, either side: ours (a remote model on the shared executor) or
plain (transformers + peft with its own copy of the weights), with its adapter."""

from __future__ import annotations

import warnings

import torch
from peft import (
    IA3Config,
    LoraConfig,
    PrefixTuningConfig,
    PromptTuningConfig,
    get_peft_model,
)

# peft asks transformers 5 about gradient checkpointing by its deprecated name, once per model
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
LORA_TARGETS = ["q_proj", "v_proj"]  # peft's default for Llama: the most common adapter
RANKS = (8, 16, 32, 64)  # the decode scenarios' tenants' LoRA ranks, in turn
# generate() makes exactly max_new_tokens when no end-of-sequence token stops it: what either
# side's decode is timed with. Not min_new_tokens, whose two logits processors mask the EOS
# across the vocabulary every step (arange + isin + where over 50k: 2.5 of tiny-llama's 5.0 ms a
# token, on both sides alike), a cost generate() at its default settings does not have.
FIXED_LENGTH = {"eos_token_id": None}


def adapter(method: str, rank: int):
    if method == "lora":
        return LoraConfig(task_type="CAUSAL_LM", r=rank, lora_alpha=2 * rank,
                          target_modules=LORA_TARGETS)
    if method == "ia3":
        return IA3Config(task_type="CAUSAL_LM", target_modules=["k_proj", "v_proj", "down_proj"],
                         feedforward_modules=["down_proj"])
    if method == "prefix_tuning":
        return PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=8)
    if method == "prompt_tuning":
        return PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=8)
    raise ValueError(method)


def as_worker(model):
    """`model`'s forwards on as many of the process's threads (its share, as the worker manager
    gives an inference worker) as their tokens keep busy, as a worker's (`workers.threads`)."""
    from workers.threads import ForwardThreads

    ForwardThreads(torch.get_num_threads()).attach(model)
    return model


def build(side: str, model: str, endpoint: str | None, method: str, rank: int, seed: int,
          privacy: bool = False, training: bool = False, free_base: bool = False,
          device: str = "cpu", dtype: torch.dtype = torch.float32, recompute: bool = False):
    """`device`/`dtype`: where the client runs its part; plain loads its whole model there,
    ours takes the executor's dtype (which `dtype` must match). `recompute`: gradient
    checkpointing, as a job's `gradient_checkpointing` sets it, on either side; ours otherwise
    trains with `lean.keep_less`, as a trainer does."""
    if free_base and side != "plain":
        raise ValueError("free_base measures the plain side only")
    if side == "plain":
        base = plain_base(model, device, dtype)
    else:
        from workers.remote.build import remote_model
        from workers.remote.privacy import PrivacyConfig

        private = privacy and PrivacyConfig(backward=training)  # as a trainer builds its pools
        base = remote_model(model, endpoint, client_name=f"bench-{seed}", privacy=private,
                            device=device)
        if not training:
            as_worker(base)
        if base.dtype != dtype:
            raise ValueError(f"the executor serves {base.dtype}, the client asked for {dtype}")
    torch.manual_seed(seed)
    tuned = get_peft_model(base, adapter(method, rank))
    if free_base:
        from bench.ceiling import free_base as make_free

        make_free(tuned)
    if recompute or (training and side != "plain"):  # as a trainer's model keeps activations
        from workers.training.methods import keep_for_backward

        keep_for_backward(tuned, recompute)
    return tuned


def plain_base(model: str, device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    from catalogue.resolve import resolve_model

    return AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=dtype).to(device)


def build_mixed(model: str, ranks: list[int], device: str = "cpu",
                dtype: torch.dtype = torch.float32):
    """One plain model holding several LoRA adapters (peft's mixed-adapter batches)."""
    torch.manual_seed(0)
    peft_model = get_peft_model(plain_base(model, device, dtype), adapter("lora", ranks[0]),
                                adapter_name="a0")
    for i, rank in enumerate(ranks[1:], start=1):
        peft_model.add_adapter(f"a{i}", adapter("lora", rank))
    return peft_model
