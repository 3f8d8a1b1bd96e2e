"""Counting a response request's input tokens through real processes with the official openai
SDK (`client.responses.input_tokens.count`): the count is the model's own chat template's
(transformers' apply_chat_template) and what a response to the same request reads
(`usage.input_tokens`), tools, a stored conversation and truncation included; refusals are
the Responses API's."""

from __future__ import annotations

import openai
import pytest
from transformers import AutoConfig, AutoTokenizer

from catalogue.resolve import resolve_model
from tests.e2e.adapters import MODEL
from tests.e2e.conftest import Deployment
from tests.e2e.test_responses_api import TOOLS

pytestmark = pytest.mark.slow
ASK = {"model": "acme/lora-a", "instructions": "Be brief.", "input": "Say hello."}


def test_the_count_is_the_templates_and_what_a_response_reads(deployment: Deployment) -> None:
    client = deployment.client("acme")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    counted = client.responses.input_tokens.count(**ASK)
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == len(tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}],
        add_generation_prompt=True, return_dict=False))
    made = client.responses.create(**ASK, max_output_tokens=4)
    assert made.usage.input_tokens == counted.input_tokens
    assert client.responses.input_tokens.count(**{**ASK, "model": MODEL}).input_tokens == \
        counted.input_tokens  # the base model's, as any adapter's
    with_tools = client.responses.input_tokens.count(**ASK, tools=TOOLS)
    assert with_tools.input_tokens > counted.input_tokens  # the tools are shown to the model
    assert with_tools.input_tokens == client.responses.create(
        **ASK, tools=TOOLS, tool_choice="none", max_output_tokens=4).usage.input_tokens
    going_on = {"model": "acme/lora-a", "previous_response_id": made.id, "input": "Again."}
    assert client.responses.input_tokens.count(**going_on).input_tokens == \
        client.responses.create(**going_on, max_output_tokens=4).usage.input_tokens


def test_truncation_and_refusals_are_the_responses_apis(deployment: Deployment) -> None:
    client = deployment.client("acme")
    context = AutoConfig.from_pretrained(resolve_model(MODEL)).max_position_embeddings
    items = [{"role": "user", "content": "word " * 300} for _ in range(12)]
    whole = client.responses.input_tokens.count(model="acme/lora-a", input=items)
    assert whole.input_tokens > context  # counted, though no response could read it all
    cut = client.responses.input_tokens.count(model="acme/lora-a", input=items,
                                              truncation="auto")
    assert cut.input_tokens <= context < whole.input_tokens
    for fields, param in (({"personality": "friendly"}, "personality"),
                          ({"conversation": "conv_1"}, "conversation"),
                          ({"input": [], "instructions": None}, "input"),
                          ({"previous_response_id": "resp_nothing"}, "previous_response_id")):
        with pytest.raises((openai.BadRequestError, openai.NotFoundError)) as refused:
            client.responses.input_tokens.count(**{**ASK, **fields})
        assert refused.value.body["param"] == param
    with pytest.raises(openai.NotFoundError):  # acme's model is not beta's to count with
        deployment.client("beta").responses.input_tokens.count(**ASK)
