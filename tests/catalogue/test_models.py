"""Built-in models are real Hugging Face directories with the real GPT-2 tokenizer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from catalogue.builtin import BUILTINS
from catalogue.resolve import resolve_model
from tests.conftest import TINY_MODELS


def test_export_command_writes_a_loadable_directory(tmp_path: Path) -> None:
    target = tmp_path / "llama"
    out = subprocess.run([sys.executable, "-m", "catalogue", "export", "tiny-llama",
                          str(target)], capture_output=True, text=True, check=True)
    assert "exported tiny-llama" in out.stdout
    names = {p.name for p in target.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    model = AutoModelForCausalLM.from_pretrained(target)
    reference = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama"))
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), f"{name}: the seeded weights differ between exports"


def test_tokenizer_is_real_gpt2_bpe() -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny-gpt2"))
    # GPT-2's published ids: "Hello" = 15496, " world" = 995, "," = 11
    assert tokenizer.encode("Hello world,") == [15496, 995, 11]
    assert tokenizer.decode([15496, 995, 11]) == "Hello world,"
    assert tokenizer.eos_token_id == 50256
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("name", TINY_MODELS)
def test_tiny_models_load_through_from_pretrained(name: str) -> None:
    path = resolve_model(name)
    config = AutoConfig.from_pretrained(path)
    assert config.model_type == BUILTINS[name].model_type
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert config.vocab_size == len(tokenizer)
    with safe_open(path / "model.safetensors", "pt") as f:
        assert len(list(f.keys())) > 5


def test_larger_sizes_are_defined_for_benchmarks() -> None:
    sizes = {name: spec for name, spec in BUILTINS.items() if not name.startswith("tiny")}
    assert "llama-160m" in sizes and "llama-1b" in sizes
    llama = sizes["llama-160m"].config
    hidden = llama["hidden_size"]
    per_layer = 4 * hidden**2 + 3 * hidden * llama["intermediate_size"]
    params = llama["num_hidden_layers"] * per_layer + 2 * llama["vocab_size"] * llama["hidden_size"]
    assert 150e6 < params < 170e6


def test_unknown_model_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError, match="unknown model"):
        resolve_model("no-such-model")
