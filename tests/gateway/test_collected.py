"""A request whose client gets the answer whole reaches the worker manager marked `collected`
(its worker then merges its tokens' Deltas, `workers.inference.merging`), a stream's does not;
merged Deltas make the same answer, usage and token counts as one Delta a token."""

from __future__ import annotations

import json

from tests.gateway.conftest import KEY
from tests.gateway.test_token_clock import histogram
from wire import manager as W

HI = [{"role": "user", "content": "Hi"}]
TOKENS = ["Hel", "lo", " the", "re", "!"]


def logprob(token: str) -> W.TokenLogprob:
    return W.TokenLogprob(token, -0.5, [], list(token.encode()))


def merged_answer(seen: list[W.Generate]):
    """A worker's events: the first token alone, then the other four in one Delta where the
    request is collected, else one a token."""

    def answer(message: W.Generate) -> list[W.Message]:
        seen.append(message)
        rest = TOKENS[1:]
        tail = [W.Delta(message.id, 0, "".join(rest), [logprob(t) for t in rest], "length",
                        tokens=len(rest))] if message.params.collected else [
            W.Delta(message.id, 0, t, [logprob(t)], "length" if t == rest[-1] else None)
            for t in rest]
        return [W.Started(message.id, 2), W.Delta(message.id, 0, TOKENS[0],
                                                  [logprob(TOKENS[0])]), *tail,
                W.Done(message.id, 2, len(TOKENS))]

    return answer


def test_a_collected_answer_comes_merged_and_is_the_streamed_ones(managed) -> None:
    client, manager = managed
    seen: list[W.Generate] = []
    manager.answer = merged_answer(seen)
    asked = {"model": "tiny-llama", "messages": HI, "logprobs": True, "max_tokens": 5}
    whole = client.post("/v1/chat/completions", headers=KEY, json=asked)
    streamed = client.post("/v1/chat/completions", headers=KEY, json={**asked, "stream": True})
    response = client.post("/v1/responses", headers=KEY, json={"model": "tiny-llama",
                                                               "input": "Hi"})
    assert [g.params.collected for g in seen] == [True, False, True]
    assert whole.status_code == streamed.status_code == response.status_code == 200
    choice = whole.json()["choices"][0]
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: {")]
    assert choice["message"]["content"] == "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) \
        == "Hello there!"
    assert [t["token"] for t in choice["logprobs"]["content"]] == TOKENS
    assert choice["finish_reason"] == "length"
    assert whole.json()["usage"]["completion_tokens"] == 5
    assert response.json()["output"][0]["content"][0]["text"] == "Hello there!"
    metrics = client.app.state.metrics
    assert histogram(metrics, "symbiosis_time_to_first_token_seconds", tenant="acme")[0] == 3
    assert histogram(metrics, "symbiosis_inter_token_seconds", tenant="acme")[0] == 3 * 4
