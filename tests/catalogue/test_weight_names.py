"""The modules a model directory holds weights for, read without torch from its safetensors
headers, equal those transformers loads, from one file or from shards."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from catalogue.weight_names import matching, module_names


def loaded_names(directory) -> set[str]:
    model = AutoModelForCausalLM.from_pretrained(directory)
    return {key.rpartition(".")[0] for key in model.state_dict()}


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2"])
def test_the_names_are_those_transformers_loads(model: str, tmp_path) -> None:
    directory = resolve_model(model)
    names = module_names(directory)
    assert names <= loaded_names(directory) <= names | {"lm_head"}  # a tied head: saved once
    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(directory).save_pretrained(sharded,
                                                                    max_shard_size="200KB")
    assert (sharded / "model.safetensors.index.json").exists()
    assert module_names(sharded) == names
    assert module_names(tmp_path) == frozenset()  # no model here


def test_a_target_matches_as_peft_matches_it() -> None:
    names = module_names(resolve_model("tiny-llama"))
    assert sorted(matching(names, "q_proj")) == [f"model.layers.{i}.self_attn.q_proj"
                                                 for i in range(2)]
    assert matching(names, "self_attn.q_proj") == matching(names, "q_proj")
    assert matching(names, "proj") == [] and matching(names, "nonexistent") == []
