"""Where a decoder layer's frozen stretch lies, per architecture (read by the executor, which
runs stretches, and by workers, which call them): the layers and, inside each, the output
projection, the post-attention norm, the MLP, the input norm and the q/k/v projections; after
the last layer, the final norm and the output head; before the first, the token embedding where
the first layer's input norm takes it as it is (the lead: `executor.stretches.Lead`). Each of
these architectures returns the head's output as its logits, nothing done to them after (no
soft-capping, no scaling): the head's loss (`executor.loss`) relies on that."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    style: str  # which decoder layer forward it is: "llama" or "gpt2"
    layers: str  # the decoder layers, from the model's root
    attn: str  # the rest are paths inside one decoder layer
    o: str
    post_norm: str
    mlp_in: tuple[str, ...]  # (gate, up) for a gated MLP, (fc,) otherwise
    act: str
    down: str
    in_norm: str
    qkv: tuple[str, ...]
    final_norm: str  # from the model's root, as the head
    head: str
    embed: str = ""  # "": the first layer's input is more than the token embedding (GPT-2 adds
    #                   positions)


LLAMA = Recipe("llama", "model.layers", "self_attn", "self_attn.o_proj", "post_attention_layernorm",
               ("mlp.gate_proj", "mlp.up_proj"), "mlp.act_fn", "mlp.down_proj",
               "input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
               "model.norm", "lm_head", "model.embed_tokens")
GPT2 = Recipe("gpt2", "transformer.h", "attn", "attn.c_proj", "ln_2", ("mlp.c_fc",), "mlp.act",
              "mlp.c_proj", "ln_1", ("attn.c_attn",), "transformer.ln_f", "lm_head")
RECIPES = {"llama": LLAMA, "mistral": LLAMA, "qwen2": LLAMA, "gpt2": GPT2}
