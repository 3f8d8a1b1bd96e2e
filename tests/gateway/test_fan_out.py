"""A request's prompts (a completion's, an embeddings request's inputs) all reach the worker
manager at once, not each after the one before has started: a worker prefills them together
(embeds them in one forward). The stand-in manager answers none until it holds them all, then
answers them last first; the first refusal to arrive fails the request and aborts the rest."""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.settings import GatewaySettings
from tests.gateway.conftest import KEY, serving
from wire import manager as W

Answer = Callable[[W.Generate], list[W.Message]]


def index_of(message: W.Generate) -> int:
    return int(message.id.rsplit("-", 1)[1])


def completed(message: W.Generate) -> list[W.Message]:
    text = f"<{index_of(message)}>"
    return [W.Started(message.id, 2), W.Delta(message.id, 0, text, finish_reason="length"),
            W.Done(message.id, 2, 1)]


def embedded(message: W.Generate) -> list[W.Message]:
    return [W.Started(message.id, 2),
            W.Done(message.id, 2, 0, embedding=bytes([0, 0, 128, 63]) * (index_of(message) + 1))]


def held_until(count: int, answer: Answer, seen: list[W.Generate]) -> Answer:
    """Nothing answered until `count` Generates are held; then all of them, the last first."""

    def hold(message: W.Generate) -> list[W.Message]:
        seen.append(message)
        if len(seen) < count:
            return []
        return [event for held in reversed(seen) for event in answer(held)]

    return hold


def settings_of(tmp_path) -> GatewaySettings:
    return GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                           manager=f"ipc://{tmp_path}/manager.sock", first_token_timeout_s=5)


def test_every_prompt_is_sent_before_any_has_started(tmp_path) -> None:
    seen: list[W.Generate] = []
    with serving(settings_of(tmp_path)) as (client, manager):
        manager.answer = held_until(4, completed, seen)
        completion = client.post("/v1/completions", headers=KEY, json={
            "model": "tiny-llama", "prompt": ["a", "b", "c", "d"], "max_tokens": 1})
        seen.clear()
        manager.answer = held_until(3, embedded, seen)
        embeddings = client.post("/v1/embeddings", headers=KEY, json={
            "model": "tiny-llama", "input": [[1, 2], [3, 4], [5, 6]],
            "encoding_format": "float"})
    assert completion.status_code == 200, completion.text
    choices = completion.json()["choices"]
    assert [(c["index"], c["text"]) for c in choices] == [(i, f"<{i}>") for i in range(4)]
    assert completion.json()["usage"]["prompt_tokens"] == 8
    assert embeddings.status_code == 200, embeddings.text
    assert [(e["index"], e["embedding"]) for e in embeddings.json()["data"]] == [
        (i, [1.0] * (i + 1)) for i in range(3)]


def test_the_first_refusal_to_arrive_fails_the_request_and_aborts_the_rest(tmp_path) -> None:
    def refuse_the_last(message: W.Generate) -> list[W.Message]:
        if index_of(message) < 2:
            return []  # the first two never start
        return [W.Failed(message.id, 400, "context_length_exceeded", "input 2 is too long")]

    with serving(settings_of(tmp_path)) as (client, manager):
        manager.answer = refuse_the_last
        refused = client.post("/v1/embeddings", headers=KEY, json={
            "model": "tiny-llama", "input": [[1], [2], [3]]})
        deadline = time.monotonic() + 5  # the stand-in's thread reads the Aborts in a moment
        while len(manager.aborted) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        aborted = sorted(manager.aborted)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert [a.rsplit("-", 1)[1] for a in aborted] == ["0", "1"]
