"""Structured outputs, tool calls, best_of, logit_bias and the request fields honoured or refused,
through real processes with the official openai SDK (the model has random weights: only
constraints make its output parse)."""

from __future__ import annotations

import contextlib
import json
from typing import Annotated, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field, StringConstraints

from tests.e2e.adapters import MODEL
from tests.e2e.conftest import Deployment

pytestmark = pytest.mark.slow
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
             "required": ["zone"], "additionalProperties": False}}}]


class Person(BaseModel):
    name: Annotated[str, StringConstraints(max_length=12)]
    age: int = Field(ge=0, le=120)
    color: Literal["red", "green", "blue"]
    tags: list[Literal["a", "b"]] = Field(max_length=3)


def test_parse_returns_a_validated_object(deployment: Deployment) -> None:
    client = deployment.client("acme")
    for seed in range(3):
        out = client.chat.completions.parse(model="acme/lora-a", messages=ASK,
                                            response_format=Person, seed=seed,
                                            max_completion_tokens=400)
        person = out.choices[0].message.parsed
        assert isinstance(person, Person)
        assert Person.model_validate_json(out.choices[0].message.content) == person
        assert out.choices[0].finish_reason == "stop"


def test_json_modes_hold_when_streamed_and_on_completions(deployment: Deployment) -> None:
    client = deployment.client("acme")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {
        "type": "number", "minimum": 0, "maximum": 1}}, "required": ["ok", "n"]}
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, stream=True, seed=3, max_completion_tokens=300,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), schema)
    anything = client.chat.completions.create(
        model=MODEL, messages=ASK, seed=4, max_completion_tokens=40,
        response_format={"type": "json_object"})
    choice = anything.choices[0]
    if choice.finish_reason == "stop":  # any object: a random model may write a long one
        assert isinstance(json.loads(choice.message.content), dict)
    else:
        assert choice.finish_reason == "length" and choice.message.content.startswith("{")
    completion = client.completions.create(
        model="acme/lora-a", prompt="JSON:", max_tokens=300, seed=5,
        extra_body={"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "w", "schema": WEATHER}}})
    jsonschema.validate(json.loads(completion.choices[0].text), WEATHER)


def calls_of(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]


def streamed_message(chunks) -> tuple[dict, str | None]:
    """An assistant message (as a history entry) gathered from stream chunks, and its finish."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": None, "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                entry["id"] = call.id or entry["id"]
                if call.function:
                    entry["function"]["name"] += call.function.name or ""
                    entry["function"]["arguments"] += call.function.arguments or ""
    message = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[k] for k in sorted(calls)]
    return message, finish


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_round_trip(deployment: Deployment, stream: bool) -> None:
    client = deployment.client("acme")
    ask = {"model": "acme/lora-a", "messages": ASK, "tools": TOOLS, "tool_choice": "required",
           "seed": 1, "max_completion_tokens": 600}
    if stream:
        message, finish = streamed_message(client.chat.completions.create(**ask, stream=True))
    else:
        choice = client.chat.completions.create(**ask).choices[0]
        message, finish = choice.message.model_dump(exclude_none=True), choice.finish_reason
    assert finish == "tool_calls" and message.get("content") is None
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
             for c in message["tool_calls"]]
    assert calls and len({c["id"] for c in message["tool_calls"]}) == len(calls)
    for name, arguments in calls:
        schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)
        jsonschema.validate(arguments, schema)
    history = [*ASK, message, *({"role": "tool", "tool_call_id": call["id"],
                                 "content": "sunny, 21 C"} for call in message["tool_calls"])]
    answer = {"model": "acme/lora-a", "messages": history, "tools": TOOLS,
              "tool_choice": "none", "max_completion_tokens": 5, "temperature": 0}
    whole = client.chat.completions.create(**answer)
    assert whole.choices[0].message.content and whole.choices[0].finish_reason == "length"
    shown = sum(len(json.dumps(arguments)) for _, arguments in calls) // 8
    first_prompt = client.chat.completions.create(**{**ask, "max_completion_tokens": 1,
                                                     "tool_choice": "none"}).usage.prompt_tokens
    assert whole.usage.prompt_tokens > first_prompt + shown  # the calls and results were shown
    if stream:
        reply, finish = streamed_message(client.chat.completions.create(**answer, stream=True))
        assert (reply["content"], finish) == (whole.choices[0].message.content, "length")


def test_a_named_tool_call_streams_as_openai_streams_it(deployment: Deployment) -> None:
    client = deployment.client("acme")
    request = {"model": "acme/lora-a", "messages": ASK, "tools": TOOLS, "seed": 9,
               "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
               "max_completion_tokens": 600}
    for limit, finish in ((600, "tool_calls"), (24, "length")):  # whole; cut in its arguments
        ask = {**request, "max_completion_tokens": limit}
        whole = client.chat.completions.create(**ask).choices[0]
        streamed: dict[int, dict] = {}
        pieces = 0
        for chunk in client.chat.completions.create(**ask, stream=True):
            for choice in chunk.choices:
                assert choice.finish_reason in (None, finish)
                for call in choice.delta.tool_calls or []:
                    entry = streamed.setdefault(call.index, {"id": None, "name": "",
                                                             "arguments": ""})
                    entry["id"] = call.id or entry["id"]
                    entry["name"] += call.function.name or "" if call.function else ""
                    entry["arguments"] += call.function.arguments or "" if call.function else ""
                    pieces += bool(call.function and call.function.arguments)
        assert whole.finish_reason == finish
        assert [(e["name"], e["arguments"]) for e in streamed.values()] == \
            [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
        assert all(e["id"].startswith("call_") for e in streamed.values())
        assert {e["name"] for e in streamed.values()} == {"get_weather"}
        assert pieces > 1  # the arguments as they were written
    assert streamed[0]["arguments"]  # the call the cut ended, as far as it got
    with pytest.raises(ValueError):
        json.loads(streamed[0]["arguments"])


def test_best_of_returns_the_most_likely_of_its_samples(deployment: Deployment) -> None:
    client = deployment.client("acme")
    common = {"model": "acme/lora-a", "prompt": "Once", "max_tokens": 6, "seed": 11,
              "temperature": 1.0}
    samples = client.completions.create(**common, n=3, logprobs=0)
    best = client.completions.create(**common, n=1, best_of=3)

    def mean_logprob(choice) -> float:
        values = choice.logprobs.token_logprobs
        return sum(values) / len(values)

    ranked = sorted(samples.choices, key=mean_logprob, reverse=True)
    assert [c.text for c in best.choices] == [ranked[0].text]
    assert best.choices[0].logprobs is None
    assert best.usage.completion_tokens == samples.usage.completion_tokens


def test_logit_bias_forces_and_forbids_tokens(deployment: Deployment) -> None:
    client = deployment.client("acme")
    reference = deployment.reference("acme/lora-a")
    fox = reference.ids(" fox")[0]
    forced = client.completions.create(model="acme/lora-a", prompt="The", max_tokens=4,
                                       logit_bias={str(fox): 100}, temperature=1.0)
    assert forced.choices[0].text == " fox" * 4
    greedy = client.completions.create(model="acme/lora-a", prompt="The", max_tokens=1,
                                       temperature=0)
    first = reference.ids(greedy.choices[0].text)[0]
    banned = client.completions.create(model="acme/lora-a", prompt="The", max_tokens=1,
                                       temperature=0, logit_bias={str(first): -100})
    assert banned.choices[0].text != greedy.choices[0].text
    vocab = reference.model.config.vocab_size
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="acme/lora-a", prompt="The", max_tokens=1,
                                  logit_bias={str(vocab): 5})
    assert info.value.body["param"] == "logit_bias"
    assert f"token {vocab}, outside this model's vocabulary of {vocab}" in info.value.message


def test_vendor_extras_are_honoured_and_unknown_fields_refused(deployment: Deployment) -> None:
    client = deployment.client("acme")
    out = client.completions.create(
        model="acme/lora-a", prompt="The quick brown fox", max_tokens=6, temperature=0.7,
        seed=3,
        user="someone", extra_body={"top_k": 5, "ignore_eos": True, "min_tokens": 6})
    assert out.usage.completion_tokens == 6
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="acme/lora-a", prompt="The quick brown fox",
                                  max_tokens=6, extra_body={"repetition_penalty": 1.1})
    assert info.value.body["param"] == "repetition_penalty"
    assert "Unrecognized request argument" in info.value.body["message"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["named", "required"])
def test_forced_tool_calls_at_a_short_max_tokens_are_always_openai_shaped(
        deployment: Deployment, choice: str, stream: bool) -> None:
    """At 60 tokens a random model's call is often cut: what comes back is still OpenAI's
    shape (never the raw call text; the call the cut ended as far as it got), a named choice is
    one call of that function, and any completed call goes back with its result for an
    answer."""
    client = deployment.client("acme")
    tool_choice = {"type": "function", "function": {"name": "get_time"}} \
        if choice == "named" else "required"
    for seed in range(3):
        ask = {"model": "acme/lora-a", "messages": ASK, "tools": TOOLS, "seed": seed,
               "tool_choice": tool_choice, "max_completion_tokens": 60}
        if stream:
            message, finish = streamed_message(client.chat.completions.create(**ask,
                                                                              stream=True))
        else:
            done = client.chat.completions.create(**ask).choices[0]
            message, finish = done.message.model_dump(exclude_none=True), done.finish_reason
        assert message.get("content") is None, message  # a forced call is never content
        calls = message.get("tool_calls", [])
        assert finish == "length" or (finish == "tool_calls" and calls), (finish, message)
        if choice == "named":
            assert len(calls) <= 1 and all(c["function"]["name"] == "get_time" for c in calls)
        cut = calls[-1:] if finish == "length" and calls else []  # as far as it got
        for call in cut:
            with contextlib.suppress(ValueError):  # unless the cut came right after it
                json.loads(call["function"]["arguments"])
                cut = []
        calls = calls[:len(calls) - len(cut)]
        for call in calls:
            schema = next(t["function"]["parameters"] for t in TOOLS
                          if t["function"]["name"] == call["function"]["name"])
            jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
        if calls:
            history = [*ASK, {**message, "tool_calls": calls},
                       *({"role": "tool", "tool_call_id": c["id"], "content": "12:00"}
                         for c in calls)]
            answer = client.chat.completions.create(model="acme/lora-a", messages=history,
                                                    tools=TOOLS, max_completion_tokens=5)
            assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize("stream", [False, True])
def test_structured_outputs_fit_a_short_max_tokens(deployment: Deployment, stream: bool) -> None:
    """At 60 tokens the random model's constrained output still completes and parses: the
    grammar leaves it no room to wander (no free whitespace)."""
    client = deployment.client("acme")
    for seed in range(4):
        if stream:
            with client.chat.completions.stream(model="acme/lora-a", messages=ASK, seed=seed,
                                                response_format=Person,
                                                max_completion_tokens=60) as events:
                out = events.get_final_completion()
        else:
            out = client.chat.completions.parse(model="acme/lora-a", messages=ASK, seed=seed,
                                                response_format=Person,
                                                max_completion_tokens=60)
        assert out.choices[0].finish_reason == "stop", out.choices[0]
        assert isinstance(out.choices[0].message.parsed, Person)
