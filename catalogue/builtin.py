"""Named configs for the built-in models: real transformers architectures, seeded random weights.

Tiny sizes serve the tests; the larger sizes serve the benchmarks. Every model uses the GPT-2 BPE
vocabulary (plus two ChatML tokens), so one tokenizer fits them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GPT2_VOCAB = 50257
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>")
VOCAB_SIZE = GPT2_VOCAB + len(CHAT_TOKENS)  # the built-in tokenizer's (catalogue.tokenizer)

TINY = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128}


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    model_type: str
    config: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    description: str = ""


def _llama_like(model_type: str, hidden: int, layers: int, heads: int, kv_heads: int,
                intermediate: int, **extra: Any) -> dict[str, Any]:
    return {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": intermediate,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        **extra,
    }


def _gpt2(hidden: int, layers: int, heads: int, **extra: Any) -> dict[str, Any]:
    return {
        "vocab_size": VOCAB_SIZE,
        "n_embd": hidden,
        "n_layer": layers,
        "n_head": heads,
        "n_positions": 1024,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        **extra,
    }


def _gemma2(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
            head_dim: int) -> dict[str, Any]:
    return _llama_like(
        "gemma2", hidden, layers, heads, kv_heads, intermediate,
        head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=64,
        tie_word_embeddings=True,
    )


_BUILTINS = [
    BuiltinModel("tiny-llama", "llama", _llama_like("llama", **TINY), seed=1,
                 description="Llama, 2 layers, hidden 64, GQA"),
    BuiltinModel("tiny-gpt2", "gpt2", _gpt2(64, 2, 4), seed=2,
                 description="GPT-2 (Conv1D), 2 layers, hidden 64, tied lm_head"),
    BuiltinModel("tiny-gemma2", "gemma2", _gemma2(64, 2, 4, 2, 128, 16), seed=3,
                 description="Gemma2, 2 layers, hidden 64, sliding window + softcapping"),
    BuiltinModel("tiny-starcoder", "gpt_bigcode",
                 _gpt2(64, 2, 4, multi_query=True), seed=4,
                 description="GPTBigCode (StarCoder), multi-query attention, 2 layers"),
    BuiltinModel("tiny-qwen2", "qwen2", _llama_like("qwen2", **TINY), seed=5,
                 description="Qwen2 (q/k/v bias), 2 layers, hidden 64"),
    BuiltinModel("tiny-mistral", "mistral",
                 _llama_like("mistral", **TINY, sliding_window=None), seed=6,
                 description="Mistral, 2 layers, hidden 64"),
    BuiltinModel("llama-160m", "llama",
                 _llama_like("llama", 768, 12, 12, 12, 2048), seed=11,
                 description="Llama, 162M params (benchmarks)"),
    BuiltinModel("gpt2-124m", "gpt2", _gpt2(768, 12, 12), seed=12,
                 description="GPT-2 small shape, 124M params (benchmarks)"),
    BuiltinModel("qwen2-150m", "qwen2",
                 _llama_like("qwen2", 768, 12, 12, 4, 2048), seed=13,
                 description="Qwen2, ~150M params (benchmarks)"),
    BuiltinModel("llama-1b", "llama",
                 _llama_like("llama", 2048, 22, 32, 4, 5632), seed=14,
                 description="Llama, TinyLlama shape, 1.2B params (capacity benchmarks)"),
]

BUILTINS: dict[str, BuiltinModel] = {m.name: m for m in _BUILTINS}
