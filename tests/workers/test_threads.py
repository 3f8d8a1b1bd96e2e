"""A worker's forward and a trainer's step run on their share of the cores, but on no more threads
than their tokens keep busy (`TOKENS_PER_THREAD` each): the rule, and a worker's models taking
it before each forward however the forward is called (plain, through peft's LoRA, through prompt
tuning's virtual tokens)."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, PromptTuningConfig, TaskType, get_peft_model
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from workers.threads import ForwardThreads, step_threads


def test_a_step_takes_a_thread_per_tokens_per_thread_up_to_its_share() -> None:
    assert [step_threads(2, t) for t in (0, 32, 64, 128, 255, 256, 4096)] == [1, 1, 1, 1, 1, 2, 2]
    assert [step_threads(16, t) for t in (32, 256, 1000, 2048, 4096)] == [1, 2, 7, 16, 16]
    assert step_threads(1, 4096) == 1


def _watched(base: torch.nn.Module) -> list[int]:
    """The threads each forward's head ran on (inside the forward, after every layer)."""
    seen: list[int] = []
    base.get_output_embeddings().register_forward_pre_hook(
        lambda *_: seen.append(torch.get_num_threads()))
    return seen


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
@pytest.mark.parametrize("wrap", ["none", "lora", "prompt_tuning"])
def test_a_workers_forwards_take_threads_by_their_tokens(name: str, wrap: str,
                                                         threads_back) -> None:
    base = AutoModelForCausalLM.from_pretrained(resolve_model(name)).eval()
    threads = ForwardThreads(share=3)
    threads.attach(base)  # as a worker attaches each base model it builds, before any adapter
    tuning = {"lora": LoraConfig(r=4, target_modules=["q_proj", "v_proj"] if name ==
                                 "tiny-llama" else ["c_attn"]),
              "prompt_tuning": PromptTuningConfig(task_type=TaskType.CAUSAL_LM,
                                                  num_virtual_tokens=64)}
    model = base if wrap == "none" else get_peft_model(base, tuning[wrap])
    seen = _watched(base)
    torch.set_num_threads(3)
    with torch.no_grad():
        for rows, length in ((1, 256), (8, 1), (1, 640), (2, 128)):
            model(input_ids=torch.ones(rows, length, dtype=torch.long))
        threads.share = 1  # the manager told it: a second worker started
        model(input_ids=torch.ones(1, 640, dtype=torch.long))
    # prompt tuning's 64 virtual tokens go in front of every row of every forward
    assert seen == ([2, 3, 3, 3, 1] if wrap == "prompt_tuning" else [2, 1, 3, 2, 1])
