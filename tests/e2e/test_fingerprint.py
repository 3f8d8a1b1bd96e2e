"""`system_fingerprint` on a real stack, read with the official SDK: every chat completion and
completion, made at once or streamed (each chunk), and a stored chat completion read back, names
the backend that answered (the executor's dtype and device among it); the same version answers
with the same one, another version or the base model with another; the Responses API's objects,
whose schema has none, carry none."""

from __future__ import annotations

import re

import pytest

from gateway.fingerprint import fingerprint
from tests.e2e.adapters import MODEL, save_adapter
from tests.e2e.conftest import Deployment
from tests.e2e.test_versions import upload

pytestmark = pytest.mark.slow
ASK = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}
BACKEND = "float32 on cpu"  # the stack's executor: the default dtype on a CPU


def test_each_answer_names_the_version_that_answered(deployment: Deployment, tmp_path) -> None:
    client = deployment.client("acme")
    for seed in (31, 32):
        upload(deployment, "marked", save_adapter(tmp_path / f"v{seed}", "lora", seed), True)
    seen = {}
    for model in (MODEL, "acme/marked@1", "acme/marked@2", "acme/marked"):
        raw = client.chat.completions.with_raw_response.create(model=model, **ASK)
        answered, chat = raw.headers["x-symbiosis-model-version"], raw.parse()
        assert re.fullmatch(r"fp_[0-9a-f]{10}", chat.system_fingerprint)
        assert chat.system_fingerprint == fingerprint(MODEL, answered, BACKEND)
        seen[model] = chat.system_fingerprint
        chunks = list(client.chat.completions.create(model=model, stream=True,
                                                     stream_options={"include_usage": True},
                                                     **ASK))
        assert chunks and {c.system_fingerprint for c in chunks} == {chat.system_fingerprint}
        text = client.completions.create(model=model, prompt="Hi", max_tokens=2)
        streamed = list(client.completions.create(model=model, prompt="Hi", max_tokens=2,
                                                  stream=True))
        assert {text.system_fingerprint} | {c.system_fingerprint for c in streamed} == \
            {chat.system_fingerprint}
    assert len({seen[MODEL], seen["acme/marked@1"], seen["acme/marked@2"]}) == 3
    assert seen[MODEL] != fingerprint(MODEL, MODEL, "bfloat16 on cpu")  # another dtype: another
    assert seen["acme/marked"] == seen["acme/marked@2"]  # the version in service
    stored = client.chat.completions.create(model="acme/marked@1", store=True, **ASK)
    assert client.chat.completions.retrieve(stored.id).system_fingerprint == \
        seen["acme/marked@1"]
    response = client.responses.create(model=MODEL, input="Hi", max_output_tokens=3)
    assert "system_fingerprint" not in response.model_dump()
