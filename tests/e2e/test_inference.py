"""OpenAI-compatible inference through real processes, checked with the official openai SDK and
against plain transformers + peft."""

from __future__ import annotations

import math
import threading

import httpx
import openai
import pytest

from tests.e2e.adapters import MODEL
from tests.e2e.conftest import OPERATOR, Deployment

pytestmark = pytest.mark.slow
PROMPT = "The quick brown fox"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]


def test_models_list_and_retrieve(deployment: Deployment) -> None:
    client = deployment.client("acme")
    ids = [m.id for m in client.models.list().data]  # other tests' acme models may follow
    assert ids[:3] == [MODEL, "acme/lora-a", "acme/prefix-a"] and all("acme/" in i for i in ids[1:])
    model = client.models.retrieve("acme/lora-a")  # the SDK sends the slash as %2F
    assert model.id == "acme/lora-a" and model.owned_by == "acme"
    raw = httpx.get(f"{deployment.stack.base_url}/v1/models/acme/lora-a",
                    headers={"Authorization": "Bearer sk-acme-test"})
    assert raw.status_code == 200 and raw.json()["id"] == "acme/lora-a"


@pytest.mark.parametrize("model", ["acme/lora-a", "acme/prefix-a", MODEL])
def test_greedy_completion_equals_plain_peft(deployment: Deployment, model: str) -> None:
    reference = deployment.reference(model)
    expected = reference.text(reference.greedy(reference.ids(PROMPT), 12))
    out = deployment.client("acme").completions.create(model=model, prompt=PROMPT, max_tokens=12,
                                                       temperature=0)
    assert out.choices[0].text == expected
    assert out.id.startswith("cmpl-") and out.created > 0 and out.model == model
    assert out.usage.prompt_tokens == len(reference.ids(PROMPT))
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_greedy_chat_equals_plain_peft(deployment: Deployment) -> None:
    reference = deployment.reference("acme/lora-a")
    expected = reference.text(reference.greedy(reference.ids(messages=CHAT), 10))
    out = deployment.client("acme").chat.completions.create(
        model="acme/lora-a", messages=CHAT, max_completion_tokens=10, temperature=0)
    assert out.choices[0].message.content == expected
    assert out.choices[0].message.role == "assistant"
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")


def test_chat_content_parts_and_streaming_with_usage(deployment: Deployment) -> None:
    client = deployment.client("acme")
    parts = [{"role": "user", "content": [{"type": "text", "text": "Say "},
                                          {"type": "text", "text": "hello."}]}]
    whole = client.chat.completions.create(model="acme/lora-a", messages=parts, max_tokens=8,
                                           temperature=0)
    chunks = list(client.chat.completions.create(
        model="acme/lora-a", messages=parts, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_completion_stream_matches_non_stream(deployment: Deployment) -> None:
    client = deployment.client("beta")
    whole = client.completions.create(model="beta/ia3-b", prompt=PROMPT, max_tokens=10,
                                      temperature=0)
    stream = client.completions.create(model="beta/ia3-b", prompt=PROMPT, max_tokens=10,
                                       temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == whole.choices[0].text


def test_n_and_seed_reproducibility(deployment: Deployment) -> None:
    client = deployment.client("acme")

    def sample(seed: int) -> list[str]:
        out = client.completions.create(model="acme/lora-a", prompt=PROMPT, max_tokens=8, n=3,
                                        temperature=1.0, seed=seed)
        assert [c.index for c in out.choices] == [0, 1, 2]
        return [c.text for c in out.choices]

    first, again, other = sample(7), sample(7), sample(8)
    assert first == again
    assert first != other
    assert len(set(first)) > 1  # the n sequences differ from each other


def test_stop_sequences(deployment: Deployment) -> None:
    client = deployment.client("acme")
    full = client.completions.create(model="acme/lora-a", prompt=PROMPT, max_tokens=16,
                                     temperature=0).choices[0].text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert stop.strip(), full
    out = client.completions.create(model="acme/lora-a", prompt=PROMPT, max_tokens=16,
                                    temperature=0, stop=[stop, "never-appears"])
    assert out.choices[0].text == full[: full.index(stop)]
    assert out.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="acme/lora-a", prompt=PROMPT, max_tokens=16,
                                         temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == out.choices[0].text


def test_logprobs_match_the_reference(deployment: Deployment) -> None:
    client = deployment.client("acme")
    reference = deployment.reference("acme/lora-a")
    ids = reference.ids(PROMPT)
    out = client.completions.create(model="acme/lora-a", prompt=PROMPT, max_tokens=4,
                                    temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    generated = reference.greedy(ids, 4)
    expected = reference.logprobs(ids + generated[:3])
    for i, token in enumerate(generated):
        assert math.isclose(lp.token_logprobs[i], float(expected[len(ids) - 1 + i, token]),
                            abs_tol=1e-4)
        assert len(lp.top_logprobs[i]) == 3
        assert max(lp.top_logprobs[i].values()) == pytest.approx(lp.token_logprobs[i], abs=1e-6)
    chat = client.chat.completions.create(model="acme/lora-a", messages=CHAT, max_tokens=3,
                                          temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 2 for c in content)
    assert all(c.logprob <= 0 for c in content)


def test_echo_with_logprobs_streamed_or_not(deployment: Deployment) -> None:
    """The prompt's tokens and logprobs come first, offsets count through the whole text, and a
    stream's chunks add up to the response made at once, also where a stop sequence cuts the
    text across two tokens (the stream once lacked the prompt's logprobs, started each chunk's
    offsets at 0, then counted them in the cut text)."""
    ask = {"model": "acme/lora-a", "prompt": PROMPT, "max_tokens": 3, "temperature": 0,
           "echo": True, "logprobs": 1}
    client = deployment.client("acme")
    out = client.completions.create(**ask)
    choice, logprobs = out.choices[0], out.choices[0].logprobs
    prompt_len = out.usage.prompt_tokens
    assert choice.text.startswith(PROMPT) and logprobs.token_logprobs[0] is None
    assert len(logprobs.tokens) == prompt_len + 3 and "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset == [len("".join(logprobs.tokens[:i]))
                                    for i in range(len(logprobs.tokens))]
    first, second = logprobs.tokens[prompt_len:prompt_len + 2]
    stop = {"stop": [first[-1] + second[0]]}  # across two tokens: both keep their logprobs
    assert choice.text.find(stop["stop"][0], len(PROMPT)) == len(PROMPT) + len(first) - 1
    for request, whole in ((ask, out), ({**ask, **stop}, client.completions.create(**ask, **stop))):
        text, tokens, offsets, values = "", [], [], []
        for chunk in client.completions.create(**request, stream=True):
            for part in chunk.choices:
                text += part.text
                if part.logprobs:
                    tokens += part.logprobs.tokens
                    offsets += part.logprobs.text_offset
                    values += part.logprobs.token_logprobs
        expected = whole.choices[0].logprobs
        assert (text, tokens, offsets) == (whole.choices[0].text, expected.tokens,
                                           expected.text_offset)
        assert values[0] is None and values[1:] == pytest.approx(expected.token_logprobs[1:],
                                                                 abs=1e-4)
    cut = whole.choices[0]
    assert cut.finish_reason == "stop" and choice.text.startswith(cut.text)
    assert len(cut.text) < len(choice.text)


def test_a_long_prompt_without_max_tokens_gets_what_fits(deployment: Deployment) -> None:
    """The default (16 for completions, the server's for chat) is at most what the context has
    room for: a request that never asked for more is not refused for it."""
    client = deployment.client("acme")
    ids = deployment.reference("acme/lora-a").ids(PROMPT)
    context = 2048  # tiny-llama's
    prompt = (ids * (context // len(ids) + 1))[:context - 5]
    out = client.completions.create(model="acme/lora-a", prompt=prompt, temperature=0)
    assert (out.usage.completion_tokens, out.choices[0].finish_reason) == (5, "length")
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="acme/lora-a", prompt=prompt, max_tokens=6)
    chat = client.chat.completions.create(
        model="acme/lora-a", messages=[{"role": "user", "content": "fox " * 2030}])
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == context
    assert chat.choices[0].finish_reason == "length"


def test_list_prompts_and_token_ids(deployment: Deployment) -> None:
    client = deployment.client("acme")
    reference = deployment.reference("acme/lora-a")
    ids = reference.ids(PROMPT)
    out = client.completions.create(model="acme/lora-a", prompt=[PROMPT, "Hello there"],
                                    max_tokens=5, temperature=0, n=2)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.choices[0].text == out.choices[1].text  # greedy: the n copies agree
    by_ids = client.completions.create(model="acme/lora-a", prompt=ids, max_tokens=5,
                                       temperature=0)
    assert by_ids.choices[0].text == out.choices[0].text


def test_two_tenants_at_once_with_different_methods(deployment: Deployment) -> None:
    jobs = {"acme": "acme/lora-a", "beta": "beta/ia3-b"}
    expected = {t: (lambda r: r.text(r.greedy(r.ids(PROMPT), 12)))(deployment.reference(m))
                for t, m in jobs.items()}
    got: dict[str, list[str]] = {t: [] for t in jobs}

    def run(tenant: str) -> None:
        client = deployment.client(tenant)
        for _ in range(3):
            got[tenant].append(client.completions.create(
                model=jobs[tenant], prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text)

    threads = [threading.Thread(target=run, args=(t,)) for t in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for tenant in jobs:
        assert got[tenant] == [expected[tenant]] * 3, tenant


def test_fallback_to_the_base_model_is_flagged_and_counted(deployment: Deployment) -> None:
    client = deployment.client("gamma")
    raw = client.completions.with_raw_response.create(model="gamma/broken", prompt=PROMPT,
                                                      max_tokens=6, temperature=0)
    assert raw.headers.get("x-symbiosis-fallback") == "base-model"
    base = deployment.client("acme").completions.create(model=MODEL, prompt=PROMPT, max_tokens=6,
                                                        temperature=0)
    assert raw.parse().choices[0].text == base.choices[0].text
    metrics = httpx.get(f"{deployment.stack.base_url}/metrics", headers=OPERATOR).text
    assert 'symbiosis_fallbacks_total{tenant="gamma"} 1.0' in metrics


def test_ready_and_health(deployment: Deployment) -> None:
    base = deployment.stack.base_url
    assert httpx.get(f"{base}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{base}/ready")
    assert ready.status_code == 200 and ready.json()["checks"] == {"manager": True,
                                                                   "executor": True,
                                                                   "disk": True}


def test_sdk_errors_are_typed(deployment: Deployment) -> None:
    client = deployment.client("acme")
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="no-such-model", prompt="x")
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x", max_tokens=4000)
    assert info.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{deployment.stack.base_url}/v1", api_key="wrong",
                      max_retries=0).models.list()


def test_tenants_cannot_see_each_others_models_on_any_route(deployment: Deployment) -> None:
    beta = deployment.client("beta")
    calls = [
        lambda: beta.models.retrieve("acme/lora-a"),
        lambda: beta.models.delete("acme/lora-a"),
        lambda: beta.completions.create(model="acme/lora-a", prompt="x", max_tokens=1),
        lambda: beta.chat.completions.create(model="acme/lora-a", max_tokens=1,
                                             messages=[{"role": "user", "content": "x"}]),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError):
            call()
    assert "acme/lora-a" not in [m.id for m in beta.models.list().data]
    assert deployment.client("acme").models.retrieve("acme/lora-a").id == "acme/lora-a"


def test_register_serve_and_delete_an_adapter_over_http(deployment: Deployment,
                                                        tmp_path) -> None:
    from tests.e2e.adapters import Reference, save_adapter

    directory = save_adapter(tmp_path / "uploaded", "adalora", 9)
    files = {"adapter_config": ("adapter_config.json",
                                (directory / "adapter_config.json").read_bytes()),
             "adapter_model": ("adapter_model.safetensors",
                               (directory / "adapter_model.safetensors").read_bytes())}
    headers = {"Authorization": "Bearer sk-beta-test"}
    url = f"{deployment.stack.base_url}/v1/adapters"
    created = httpx.post(url, data={"name": "uploaded"}, files=files, headers=headers)
    assert created.status_code == 201, created.text
    assert created.json()["id"] == "beta/uploaded" and created.json()["peft_type"] == "ADALORA"
    assert created.json()["version"] == 1
    again = httpx.post(url, data={"name": "uploaded"}, files=files, headers=headers)
    assert again.status_code == 201 and again.json()["version"] == 2  # a new version, serving
    reference = Reference(directory)
    expected = reference.text(reference.greedy(reference.ids(PROMPT), 8))
    client = deployment.client("beta")
    out = client.completions.create(model="beta/uploaded", prompt=PROMPT, max_tokens=8,
                                    temperature=0)
    assert out.choices[0].text == expected
    assert client.models.delete("beta/uploaded").deleted
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="beta/uploaded", prompt=PROMPT, max_tokens=1)


def test_an_empty_prompt_starts_a_new_document(deployment: Deployment) -> None:
    out = deployment.client("acme").completions.create(model=MODEL, prompt="", max_tokens=3,
                                                       temperature=0)
    assert out.usage.prompt_tokens == 1 and out.usage.completion_tokens == 3  # <|endoftext|>
