"""PEFT adapters for end-to-end tests, saved to disk, and their plain transformers references."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from catalogue.resolve import resolve_model
from tests.peft_reference import peft_config

MODEL = "tiny-llama"


def save_adapter(directory: Path, method: str, seed: int) -> Path:
    """A random (non-trivial) adapter of `method`, in PEFT format."""
    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(resolve_model(MODEL)),
                           peft_config(MODEL, method))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn(p.shape, generator=generator))
    model.save_pretrained(directory)
    return directory


class Reference:
    """Plain transformers + peft, greedy, for comparing outputs token for token."""

    def __init__(self, adapter: Path | None) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
        model = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL))
        self.model = (PeftModel.from_pretrained(model, adapter) if adapter else model).eval()

    def ids(self, prompt: str | None = None, messages: list[dict] | None = None) -> list[int]:
        if messages is not None:
            return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                           return_dict=False))
        return self.tokenizer.encode(prompt)

    @torch.no_grad()
    def greedy(self, ids: list[int], max_tokens: int) -> list[int]:
        out = self.model.generate(input_ids=torch.tensor([ids]), max_new_tokens=max_tokens,
                                  do_sample=False, attention_mask=torch.ones(1, len(ids),
                                                                             dtype=torch.long))
        return out[0, len(ids):].tolist()

    def text(self, tokens: list[int]) -> str:
        eos = set(self.model.generation_config.eos_token_id or [])
        kept = []
        for t in tokens:
            if t in eos:
                break
            kept.append(t)
        return self.tokenizer.decode(kept, skip_special_tokens=True)

    @torch.no_grad()
    def logprobs(self, ids: list[int]) -> torch.Tensor:
        """log_softmax of the next-token logits after each prefix of `ids`."""
        return torch.log_softmax(self.model(input_ids=torch.tensor([ids])).logits[0], dim=-1)
