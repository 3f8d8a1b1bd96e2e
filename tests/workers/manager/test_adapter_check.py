"""Adapters are checked whole before they are stored: every adapter peft itself saves for the
base model passes (each method, Conv1D's transposed weights, a tied lm_head), and a file that is
corrupt, empty, for another base, or not what its config says is refused with the reason."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from peft import get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from tests.peft_reference import peft_config
from workers.manager.adapter_store import AdapterError, validate
from workers.manager.tensorfile import TensorFileError, model_shapes, read_shapes

METHODS = ["lora", "ia3", "adalora", "prefix_tuning", "prompt_tuning"]


def _saved(directory: Path, model: str, method: str) -> Path:
    torch.manual_seed(0)
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(resolve_model(model)),
                          peft_config(model, method))
    peft.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def llama_shapes():
    return model_shapes(resolve_model("tiny-llama"))


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("saved")
    return {method: _saved(root / method, "tiny-llama", method) for method in METHODS}


@pytest.mark.parametrize("method", METHODS)
def test_every_method_peft_saves_passes(method, adapters, llama_shapes) -> None:
    assert validate(adapters[method], llama_shapes) == peft_config("tiny-llama", method) \
        .peft_type.value


def test_conv1d_and_a_tied_lm_head_pass(tmp_path) -> None:
    from peft import LoraConfig, TaskType

    gpt2 = _saved(tmp_path / "gpt2", "tiny-gpt2", "lora")  # Conv1D: weights stored [in, out]
    assert validate(gpt2, model_shapes(resolve_model("tiny-gpt2"))) == "LORA"
    torch.manual_seed(0)
    head = get_peft_model(AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama")),
                          LoraConfig(r=4, target_modules=["q_proj", "lm_head"],
                                     task_type=TaskType.CAUSAL_LM))
    head.save_pretrained(tmp_path / "head")
    assert validate(tmp_path / "head", model_shapes(resolve_model("tiny-llama"))) == "LORA"


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def _rewrite(directory: Path, tensors: dict[str, torch.Tensor]) -> None:
    save_file({k: v.contiguous() for k, v in tensors.items()},
              directory / "adapter_model.safetensors")


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(directory / "adapter_model.safetensors")


def _corruptions(lora: Path, tmp_path: Path):
    """(name, directory, what the refusal says)."""
    weights = _tensors(lora)
    a_key = next(k for k in weights if k.endswith("q_proj.lora_A.weight"))
    cases = []

    def case(name: str, reason: str, tensors: dict | None = None, raw: bytes | None = None,
             config: dict | None = None) -> None:
        directory = _copy(lora, tmp_path / name)
        if tensors is not None:
            _rewrite(directory, tensors)
        if raw is not None:
            (directory / "adapter_model.safetensors").write_bytes(raw)
        if config is not None:
            original = json.loads((directory / "adapter_config.json").read_text())
            (directory / "adapter_config.json").write_text(json.dumps({**original, **config}))
        cases.append((name, directory, reason))

    whole = (lora / "adapter_model.safetensors").read_bytes()
    case("empty-file", "too short", raw=b"")
    case("truncated", "lie outside the file", raw=whole[:-100])
    case("trailing-bytes", "bytes follow the last tensor", raw=whole + b"\0" * 8)
    case("not-json", "header is not JSON", raw=struct.pack("<Q", 4) + b"{{{{")
    case("no-tensors", "holds no tensors", raw=struct.pack("<Q", 2) + b"{}")
    case("empty-tensor", "is empty", tensors={**weights, a_key: torch.zeros(0, 64)})
    case("wrong-rank", "the config says r=", tensors={**weights, a_key: torch.zeros(3, 64)},
         config=None)
    case("other-base", "needs [", tensors={k: torch.zeros(v.shape[0], 128) if "lora_A" in k
                                             else v for k, v in weights.items()})
    case("unknown-module", "does not have",
         tensors={**weights, a_key.replace("layers.0", "layers.9"): weights[a_key].clone()})
    case("stray-tensor", "is not one a LORA adapter has",
         tensors={**weights, "base_model.model.extra": torch.zeros(2)})
    case("rank-in-config", "the config says r=", config={"r": 8})
    # what peft loads with a warning only: weights it drops, or modules it leaves at zero
    case("untargeted-tensor", "do not name: peft would leave it out", config={
        "target_modules": ["q_prj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj"]})
    case("target-without-weights", "holds no weights for it",
         tensors={k: v for k, v in weights.items() if ".layers.1.mlp.up_proj." not in k})
    return cases


def test_corrupt_or_mismatched_adapters_are_refused_with_the_reason(adapters, llama_shapes,
                                                                    tmp_path) -> None:
    for name, directory, reason in _corruptions(adapters["lora"], tmp_path):
        with pytest.raises(AdapterError) as refused:
            validate(directory, llama_shapes)
        assert reason in str(refused.value), (name, str(refused.value))


def test_virtual_tokens_must_fit_their_config(adapters, llama_shapes, tmp_path) -> None:
    for method, rows, dim in (("prompt_tuning", 4, 32), ("prefix_tuning", 3, 128)):
        directory = _copy(adapters[method], tmp_path / method)
        _rewrite(directory, {"prompt_embeddings": torch.zeros(rows, dim)})
        with pytest.raises(AdapterError, match="prompt_embeddings has shape"):
            validate(directory, llama_shapes)


def test_the_reader_refuses_overlapping_tensors(tmp_path) -> None:
    header = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}).encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 12)
    with pytest.raises(TensorFileError, match="overlap or leave gaps"):
        read_shapes(path)
