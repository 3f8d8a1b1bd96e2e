"""The Responses API through real processes with the official openai SDK: greedy text equal to
plain peft's, a stream that adds up to the response, a function call round trip, refusals."""

from __future__ import annotations

import json
import math

import httpx
import jsonschema
import openai
import pytest

from tests.e2e.conftest import KEYS, Deployment
from tests.e2e.test_structured import WEATHER, Person

pytestmark = pytest.mark.slow
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather.",
          "parameters": WEATHER}]


def test_greedy_text_equals_plain_peft_at_once_and_streamed(deployment: Deployment) -> None:
    reference = deployment.reference("acme/lora-a")
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Say hello."}]
    tokens = reference.greedy(reference.ids(messages=messages), 10)
    expected = reference.text(tokens)
    client = deployment.client("acme")
    made = client.responses.create(model="acme/lora-a", instructions="Be brief.",
                                   input="Say hello.", max_output_tokens=10, temperature=0)
    assert made.object == "response" and made.id.startswith("resp_")
    assert made.output_text == expected and made.instructions == "Be brief."
    eos = set(reference.model.generation_config.eos_token_id or [])
    ended = next((k + 1 for k, t in enumerate(tokens) if t in eos), None)  # tokens with EOS
    assert made.status == ("completed" if ended else "incomplete")
    assert made.usage.input_tokens == len(reference.ids(messages=messages))
    assert made.usage.output_tokens == (ended or 10)
    events = list(client.responses.create(
        model="acme/lora-a", instructions="Be brief.", input="Say hello.",
        max_output_tokens=10, temperature=0, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == \
        expected
    last = events[-1]
    assert last.type == f"response.{made.status}" and last.response.output_text == expected
    assert last.response.usage == made.usage


def test_logprobs_match_plain_peft(deployment: Deployment) -> None:
    reference = deployment.reference("acme/lora-a")
    ids = reference.ids(messages=[{"role": "user", "content": "Say hello."}])
    generated = reference.greedy(ids, 4)
    expected = reference.logprobs(ids + generated[:3])
    client = deployment.client("acme")
    made = client.responses.create(model="acme/lora-a", input="Say hello.", temperature=0,
                                   max_output_tokens=4, top_logprobs=2,
                                   include=["message.output_text.logprobs"])
    logprobs = made.output[0].content[0].logprobs
    assert len(logprobs) == 4 and all(len(lp.top_logprobs) == 2 for lp in logprobs)
    for i, (lp, token) in enumerate(zip(logprobs, generated, strict=True)):
        assert math.isclose(lp.logprob, float(expected[len(ids) - 1 + i, token]), abs_tol=1e-4)
        assert lp.top_logprobs[0].logprob == pytest.approx(lp.logprob, abs=1e-6)
    events = list(client.responses.create(
        model="acme/lora-a", input="Say hello.", temperature=0, max_output_tokens=4,
        top_logprobs=2, include=["message.output_text.logprobs"], stream=True))
    streamed = [lp for e in events if e.type == "response.output_text.delta"
                for lp in e.logprobs]
    assert [(lp.token, lp.logprob) for lp in streamed] == \
        [(lp.token, lp.logprob) for lp in logprobs]


def test_a_function_call_round_trip(deployment: Deployment) -> None:
    client = deployment.client("acme")
    made = client.responses.create(model="acme/lora-a", input="Weather in Paris?",
                                   tools=TOOLS, tool_choice="required", extra_body={"seed": 1},
                                   parallel_tool_calls=False, max_output_tokens=600)
    assert made.status == "completed" and [o.type for o in made.output] == ["function_call"]
    call = made.output[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    history = [{"role": "user", "content": "Weather in Paris?"},
               call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    answer = client.responses.create(model="acme/lora-a", input=history, tools=TOOLS,
                                     tool_choice="none", max_output_tokens=4)
    assert [o.type for o in answer.output] == ["message"] and answer.output_text
    streamed = list(client.responses.create(
        model="acme/lora-a", input="Weather in Paris?", tools=TOOLS, tool_choice="required",
        extra_body={"seed": 1}, parallel_tool_calls=False, max_output_tokens=600,
        stream=True))
    arguments = "".join(e.delta for e in streamed
                        if e.type == "response.function_call_arguments.delta")
    jsonschema.validate(json.loads(arguments), WEATHER)
    assert streamed[-1].response.output[0].arguments == arguments


def test_parse_returns_a_validated_object_at_once_and_streamed(deployment: Deployment) -> None:
    client = deployment.client("acme")
    made = client.responses.parse(model="acme/lora-a", input="Who?", text_format=Person,
                                  max_output_tokens=200)
    assert made.status == "completed" and isinstance(made.output_parsed, Person)
    assert made.output_parsed == Person.model_validate_json(made.output_text)
    with client.responses.stream(model="acme/lora-a", input="Who?", text_format=Person,
                                 max_output_tokens=200) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.output_parsed == Person.model_validate_json(deltas)


def test_what_is_not_served_is_refused_by_name(deployment: Deployment) -> None:
    client = deployment.client("acme")
    for fields, param in (({"reasoning": {"effort": "low"}}, "reasoning"),
                          ({"input": [{"type": "function_call_output", "call_id": "c",
                                       "output": "sunny"}]}, "input.0.call_id"),
                          ({"tools": [{"type": "web_search"}]}, "tools.0.type")):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(**{"model": "acme/lora-a", "input": "Hi", **fields})
        assert refused.value.body["param"] == param, refused.value.body
    with pytest.raises(openai.NotFoundError):
        deployment.client("beta").responses.create(model="acme/lora-a", input="Hi")
    raw = httpx.post(f"{deployment.stack.base_url}/v1/responses",
                     headers={"Authorization": f"Bearer {KEYS['acme']}"},
                     json={"model": "acme/lora-a", "input": "Hi", "max_output_tokens": 2,
                           "stream": True}, timeout=60)
    blocks = raw.text.strip().split("\n\n")
    assert blocks[0].startswith("event: response.created\ndata: {")
    assert all(b.split("\n")[0] == f"event: {json.loads(b.split('data: ')[1])['type']}"
               for b in blocks) and "[DONE]" not in raw.text


def test_truncation_auto_drops_the_earliest_items_to_fit(deployment: Deployment) -> None:
    """A conversation longer than the context: a 400 by default; with truncation "auto" the
    answer plain peft gives the conversation without its earliest items (the instructions
    kept), dropped one by one until the prompt and max_output_tokens fit."""
    reference = deployment.reference("acme/lora-a")
    limit = reference.model.config.max_position_embeddings
    turns = [{"role": "user" if k % 2 == 0 else "assistant",
              "content": f"Turn {k}: " + "word " * 150} for k in range(16)]
    turns.append({"role": "user", "content": "And now?"})
    ask = {"model": "acme/lora-a", "input": turns, "instructions": "Be brief.",
           "max_output_tokens": 5, "temperature": 0, "store": False}
    client = deployment.client("acme")
    with pytest.raises(openai.BadRequestError) as too_long:
        client.responses.create(**ask)
    assert too_long.value.body["code"] == "context_length_exceeded"
    made = client.responses.create(**ask, truncation="auto")
    messages = [{"role": "system", "content": "Be brief."}, *turns]
    while len(reference.ids(messages=messages)) + 5 > limit:
        del messages[1]
    ids = reference.ids(messages=messages)
    assert 2 < len(messages) < len(turns) and made.truncation == "auto"
    assert made.usage.input_tokens == len(ids)
    assert made.output_text == reference.text(reference.greedy(ids, 5))
