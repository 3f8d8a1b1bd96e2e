"""Embeddings through real processes with the official openai SDK (`client.embeddings.create`):
each input's embedding, whatever the tenant's model (the base model, a LoRA, IA3 or prefix
tuning adapter) and however it is asked (texts, token ids, `dimensions`, base64 as the SDK asks
by default, or floats), equals plain transformers + peft's final hidden state at its last
token, of length 1; refusals are OpenAI's."""

from __future__ import annotations

import json

import openai
import pytest
import torch

from tests.e2e.adapters import MODEL, Reference
from tests.e2e.conftest import Deployment
from tests.peft_reference import embedding_of

pytestmark = pytest.mark.slow
TEXTS = ["The quick brown fox", "jumps", "over the lazy dog, twice over and again"]


def expected(reference: Reference, ids: list[int], dimensions: int = 0) -> torch.Tensor:
    return embedding_of(reference.model, ids, dimensions)


def close(got: list[float], want: torch.Tensor) -> bool:
    return torch.allclose(torch.tensor(got), want, atol=2e-5)


@pytest.mark.parametrize(("tenant", "model"), [("acme", "acme/lora-a"), ("beta", "beta/ia3-b"),
                                               ("acme", "acme/prefix-a"), ("acme", MODEL)])
def test_each_input_embeds_as_plain_peft(deployment: Deployment, tenant: str, model: str) -> None:
    client, reference = deployment.client(tenant), deployment.reference(model)
    made = client.embeddings.create(model=model, input=TEXTS)  # base64, as the SDK asks
    ids = [reference.ids(text) for text in TEXTS]
    assert made.object == "list" and made.model == model
    assert [e.index for e in made.data] == [0, 1, 2]
    assert all(e.object == "embedding" for e in made.data)
    for embedding, prompt in zip(made.data, ids, strict=True):
        assert close(embedding.embedding, expected(reference, prompt)), model
    assert made.usage.prompt_tokens == made.usage.total_tokens == sum(map(len, ids))
    floats = client.embeddings.create(model=model, input=TEXTS[0], encoding_format="float")
    assert floats.data[0].embedding == made.data[0].embedding  # the same float32 values
    short = client.embeddings.create(model=model, input=ids[2], dimensions=16)
    assert close(short.data[0].embedding, expected(reference, ids[2], 16))
    assert short.usage.prompt_tokens == len(ids[2])


def test_token_lists_and_an_adapter_differ_from_the_base(deployment: Deployment) -> None:
    client = deployment.client("acme")
    ids = [[1, 15, 27, 3, 99], [1, 44]]
    adapter = client.embeddings.create(model="acme/lora-a", input=ids)
    base = client.embeddings.create(model=MODEL, input=ids)
    reference = deployment.reference("acme/lora-a")
    for embedding, prompt in zip(adapter.data, ids, strict=True):
        assert close(embedding.embedding, expected(reference, prompt))
    assert not close(adapter.data[0].embedding, torch.tensor(base.data[0].embedding))
    raw = client.embeddings.with_raw_response.create(model="acme/lora-a", input="hi")
    assert raw.headers["x-symbiosis-model-version"] == "acme/lora-a@1"
    assert raw.headers["transfer-encoding"] == "chunked"  # sent as it is rendered
    assert "system_fingerprint" not in json.loads(raw.text)  # OpenAI's embeddings carry none


@pytest.mark.parametrize(("fields", "param"), [
    ({"input": ""}, "input"), ({"input": ["a", ""]}, "input"), ({"input": []}, "input"),
    ({"input": [[1, 2], []]}, "input"), ({"dimensions": 0}, "dimensions"),
    ({"dimensions": 65}, "dimensions"), ({"input": [10**6]}, "input"),
    ({"encoding_format": "int8"}, "encoding_format"), ({"input": ["x"] * 2049}, "input")])
def test_bad_input_is_refused_as_openai_does(deployment: Deployment, fields: dict,
                                             param: str) -> None:
    client = deployment.client("acme")
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(**{"model": "acme/lora-a", "input": "x", **fields})
    assert refused.value.body["param"] == param, refused.value.body


def test_too_long_an_input_and_another_tenants_model(deployment: Deployment) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        deployment.client("acme").embeddings.create(model="acme/lora-a", input=[1] * 5000)
    assert refused.value.body["code"] == "context_length_exceeded"
    assert "an input has 5000 tokens" in refused.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        deployment.client("beta").embeddings.create(model="acme/lora-a", input="hello")
