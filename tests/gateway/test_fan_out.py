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


def settings_of(tmp_path, first_s: float = 5, next_s: float = 120) -> GatewaySettings:
    return GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                           manager=f"ipc://{tmp_path}/manager.sock",
                           first_token_timeout_s=first_s, next_token_timeout_s=next_s)


def aborted_once(manager, count: int) -> list[str]:
    """The prompts' indices in the stand-in's one Abort, once it came (its thread reads it a
    moment after the answer) naming `count`."""
    deadline = time.monotonic() + 5
    while not manager.aborted and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # no second Abort
    assert len(manager.aborted) == 1 and len(manager.aborted[0]) == count, manager.aborted
    return sorted(a.rsplit("-", 1)[1] for a in manager.aborted[0])


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
        aborted = aborted_once(manager, 2)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert aborted == ["0", "1"]


def timed_out(settings: GatewaySettings, answer: Answer, aborts: int) -> tuple[float, list[str]]:
    """A completion of three prompts the stand-in answers so: the request's seconds, and the
    prompts aborted; it must fail with the timeout's 503."""
    with serving(settings) as (client, manager):
        manager.answer = answer
        began = time.monotonic()
        failed = client.post("/v1/completions", headers=KEY, json={
            "model": "tiny-llama", "prompt": ["a", "b", "c"], "max_tokens": 4})
        waited = time.monotonic() - began
        aborted = aborted_once(manager, aborts)
    assert failed.status_code == 503, failed.text
    assert failed.json()["error"]["code"] == "timeout"
    assert failed.json()["error"]["message"] == "no answer from a worker within 1 s"
    return waited, aborted


def test_prompts_that_never_start_fail_the_request_at_the_first_timeout(tmp_path) -> None:
    def start_the_first(message: W.Generate) -> list[W.Message]:
        return [W.Started(message.id, 1)] if index_of(message) == 0 else []

    waited, aborted = timed_out(settings_of(tmp_path, first_s=1), start_the_first, 3)
    assert 1 <= waited < 4
    assert aborted == ["0", "1", "2"]


def test_a_started_prompt_that_goes_quiet_fails_the_request_at_the_next_timeout(
        tmp_path) -> None:
    """The others finish; the one that stops after its first token fails the request once it
    has been quiet `next_token_timeout_s`, and is aborted (the finished ones are not)."""

    def stall_the_second(message: W.Generate) -> list[W.Message]:
        if index_of(message) == 1:
            return [W.Started(message.id, 1), W.Delta(message.id, 0, "x")]
        return completed(message)

    waited, aborted = timed_out(settings_of(tmp_path, next_s=1), stall_the_second, 1)
    assert 1 <= waited < 4
    assert aborted == ["1"]
