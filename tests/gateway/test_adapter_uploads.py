"""Adapter uploads that cannot be taken are 400s naming what is wrong: the name, the config, the
weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openapi import fine_tuning
from tests.gateway.conftest import KEY
from tests.gateway.test_validation import assert_openai_error
from wire import store

CONTRACT = Path(__file__).parents[2] / "openapi" / "openapi.json"


@pytest.mark.parametrize("config", [b"[1, 2]", b'"lora"', b"null", b"7"])
def test_an_adapter_config_that_is_not_an_object_is_400(client, config: bytes) -> None:
    response = client.post("/v1/adapters", headers=KEY, data={"name": "x"},
                           files={"adapter_config": ("adapter_config.json", config),
                                  "adapter_model": ("adapter_model.safetensors", b"\0" * 16)})
    error = assert_openai_error(response, 400)
    assert error["code"] == "invalid_adapter" and "JSON object" in error["message"]
    assert error["param"] == "adapter_config"


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".hidden", "x y", "é", "x\n", "a" * 65,
                                  ""])
def test_an_adapter_name_outside_the_rule_is_a_400_naming_it(client, name: str) -> None:
    config = json.dumps({"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"]}).encode()
    response = client.post("/v1/adapters", headers=KEY, data={"name": name},
                           files={"adapter_config": ("adapter_config.json", config),
                                  "adapter_model": ("adapter_model.safetensors", b"\0" * 16)})
    error = assert_openai_error(response, 400)
    assert error["param"] == "name", error
    assert name == "" or "a letter or digit first" in error["message"]


@pytest.mark.parametrize(("data", "files"), [({"promote_now": "1"}, {}),
                                             ({}, {"adapter_weights": ("w", b"1")})])
def test_a_form_field_the_route_does_not_take_is_a_400_naming_it(client, data: dict,
                                                                 files: dict) -> None:
    config = json.dumps({"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"]}).encode()
    response = client.post("/v1/adapters", headers=KEY, data={"name": "x", **data}, files={
        "adapter_config": ("adapter_config.json", config),
        "adapter_model": ("adapter_model.safetensors", b"\0" * 16), **files})
    error = assert_openai_error(response, 400)
    field = next(iter(data or files))
    assert error["param"] == field and field in error["message"]
    assert client.get("/v1/models", headers=KEY).json()["data"][1:] == []


@pytest.mark.parametrize(("weights", "reason"), [
    (b"", "too short"), (b"\x02\0\0\0\0\0\0\0{}", "holds no tensors"),
    (b"\xff" * 16, "not a safetensors file")])
def test_an_adapter_file_that_is_not_whole_is_400_and_nothing_is_stored(client, weights: bytes,
                                                                        reason: str) -> None:
    config = json.dumps({"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"]}).encode()
    response = client.post("/v1/adapters", headers=KEY, data={"name": "broken"},
                           files={"adapter_config": ("adapter_config.json", config),
                                  "adapter_model": ("adapter_model.safetensors", weights)})
    error = assert_openai_error(response, 400)
    assert error["code"] == "invalid_adapter" and reason in error["message"], error
    assert error["param"] == "adapter_model"
    assert client.get("/v1/models/acme/broken", headers=KEY).status_code == 404


def test_the_contract_publishes_the_one_name_rule_the_store_applies() -> None:
    published = CONTRACT.read_text()
    assert fine_tuning.ADAPTER_NAME == store.ADAPTER_NAME  # the job's register_as
    rule = json.dumps(store.ADAPTER_NAME)  # as the contract writes it (backslashes doubled)
    assert published.count(f'"pattern": {rule}') == 2  # the upload's name and register_as
