"""What the spawner loads once, before it forks, and every inference worker shares: the base
model's tokenizer (and a spare for the preparer's thread), context length and end tokens."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass
class Preloaded:
    """What the spawner loads once and every forked worker shares."""

    tokenizer: Any
    max_context: int
    eos_ids: tuple[int, ...]
    # a copy for the preparer's thread (the loop's detokenizes meanwhile), made once here:
    # made in each worker after Ready, it held up its first requests (TTFT p50 +100 ms)
    spare_tokenizer: Any


def preload(base: str) -> Preloaded:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from catalogue.resolve import resolve_model

    path = resolve_model(base)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.chat_template is None:
        tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    config = AutoConfig.from_pretrained(path)
    eos: set[int] = set()
    try:
        generation = GenerationConfig.from_pretrained(path)
        ids = generation.eos_token_id
        eos.update(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    except OSError:
        pass
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions",
                                                                          2048)
    return Preloaded(tokenizer, int(context), tuple(sorted(eos)), copy.deepcopy(tokenizer))
