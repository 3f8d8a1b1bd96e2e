"""`python -m tests.workers.training.lean_probe plain|lean`: print, as JSON, the memory a
Llama-shaped LoRA model holds after a training forward (what it keeps for the backward).

Run with MALLOC_MMAP_THRESHOLD_ low, so that every tensor of some size has pages of its own,
given back when it is freed: the resident memory then follows the tensors that live.
"""

from __future__ import annotations

import gc
import json
import sys

import psutil
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from workers.training.lean import keep_less

SHAPE = {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 1000}
TOKENS = (2, 256)


def held(mode: str) -> int:
    torch.manual_seed(0)
    model = get_peft_model(LlamaForCausalLM(LlamaConfig(**SHAPE, attn_implementation="sdpa")),
                           LoraConfig(r=8, target_modules="all-linear"))
    if mode == "lean":
        keep_less(model)
    model.train()
    ids = torch.randint(0, SHAPE["vocab_size"], TOKENS)
    process, kept = psutil.Process(), []
    for _ in range(2):  # the second step's figure: the first one's allocations are settled
        gc.collect()
        before = process.memory_info().rss
        loss = model(input_ids=ids, labels=ids).loss
        kept.append(process.memory_info().rss - before)
        loss.backward()
        del loss
    return kept[-1]


if __name__ == "__main__":
    sys.stdout.write(json.dumps({"held": held(sys.argv[1])}) + "\n")
