"""Constrained decoding and logit_bias in the engine (in-process executor, random weights).

A model with random weights picks among the tokens a grammar allows almost uniformly, which is
the hardest case for a constraint: every output must still parse and validate.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from executor.local import LocalExecutor
from gateway.structured import json_grammar, tool_calls_grammar
from gateway.tools import parse_calls
from openapi.chat import Tool
from tests.peft_reference import build_pair
from tests.workers.inference.test_engine import prompts, run, text
from wire import manager as W
from workers.inference.engine import InferenceEngine
from workers.inference.request import Request

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(MODEL))


@pytest.fixture(scope="module")
def pair():
    plain, ours = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
    return plain.eval(), ours.eval()


def engine_for(model, tokenizer, eos: int) -> InferenceEngine:
    return InferenceEngine(model, tokenizer, max_context=2048, eos_ids=(eos,), max_batch=32)


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A schema whose every size is bounded: strings, arrays, enums, number ranges."""
    kinds = ["string", "integer", "number", "boolean", "enum", "array", "null"]
    if depth < 2:
        kinds += ["object", "object"]
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(0, 12)}
    if kind == "integer":
        low = rng.randint(-1000, 1000)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 5000)}
    if kind == "number":
        low = rng.uniform(-100, 100)
        return {"type": "number", "minimum": round(low, 2), "maximum": round(low + 50, 2)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 7, None, True, "a b"],
                                   rng.randint(1, 4))}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1),
                "maxItems": rng.randint(0, 3)}
    if kind == "object":
        names = rng.sample(["id", "name", "tags", "size", "ok", "kind", "meta"],
                           rng.randint(1, 4))
        properties = {name: random_schema(rng, depth + 1) for name in names}
        required = [name for name in names if rng.random() < 0.7]
        return {"type": "object", "properties": properties, "required": required}
    return {"type": kind}


def test_fifty_random_schemas_always_give_valid_json(pair, tokenizer) -> None:
    _, ours = pair
    engine = engine_for(ours, tokenizer, tokenizer.eos_token_id)
    rng = random.Random(7)
    schemas = [{"type": "object", "properties": {"value": random_schema(rng)},
                "required": ["value"]} for _ in range(50)]
    requests = [Request(str(i), prompts()[i % 4],
                        W.SamplingParams(max_tokens=1500, temperature=1.0, seed=i,
                                         grammar=json_grammar(schema)))
                for i, schema in enumerate(schemas)]
    events = run(engine, requests, stagger=0)
    for request, schema in zip(requests, schemas, strict=True):
        finish = [e.finish_reason for e in events[request.id] if isinstance(e, W.Delta)][-1]
        assert finish == "stop", (schema, text(events[request.id]))
        jsonschema.validate(json.loads(text(events[request.id])), schema)


def test_a_cut_output_finishes_with_length(pair, tokenizer) -> None:
    _, ours = pair
    engine = engine_for(ours, tokenizer, tokenizer.eos_token_id)
    schema = {"type": "object", "properties": {"text": {"type": "string", "minLength": 40}},
              "required": ["text"]}
    request = Request("cut", prompts()[0], W.SamplingParams(
        max_tokens=5, temperature=1.0, seed=1, grammar=json_grammar(schema)))
    events = run(engine, [request])["cut"]
    deltas = [e for e in events if isinstance(e, W.Delta)]
    assert len(deltas) == 5 and deltas[-1].finish_reason == "length"
    assert text(events).startswith('{"text": "')


def test_forced_tool_calls_name_a_tool_and_match_its_parameters(pair, tokenizer) -> None:
    _, ours = pair
    engine = engine_for(ours, tokenizer, tokenizer.eos_token_id)
    weather = {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}
    tools = [Tool.model_validate({"type": "function", "function": {
        "name": name, "parameters": weather}}) for name in ("get_weather", "get_forecast")]
    grammar = tool_calls_grammar(tools, parallel=True)
    requests = [Request(f"t{i}", prompts()[i % 4], W.SamplingParams(
        max_tokens=1500, temperature=1.0, seed=i, grammar=grammar)) for i in range(6)]
    events = run(engine, requests, stagger=0)
    for request in requests:
        calls = parse_calls(text(events[request.id]), {"get_weather", "get_forecast"})
        assert calls, text(events[request.id])
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), weather)


def test_an_unusable_grammar_fails_the_request_with_400(pair, tokenizer) -> None:
    _, ours = pair
    engine = engine_for(ours, tokenizer, tokenizer.eos_token_id)
    failed = engine.add(Request("bad", [1, 2], W.SamplingParams(grammar="start: nope")))
    assert isinstance(failed[0], W.Failed) and failed[0].status == 400


def test_logit_bias_equals_transformers_sequence_bias(pair, tokenizer) -> None:
    plain, ours = pair
    engine = engine_for(ours, tokenizer, tokenizer.eos_token_id)
    prompt = prompts()[1]
    ids = torch.tensor([prompt])
    with torch.no_grad():
        unbiased = plain.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                  max_new_tokens=8, min_new_tokens=8, do_sample=False)
    first = int(unbiased[0, len(prompt)])
    bias = {first: -100.0, 1000: 5.0, 42: 100.0 if first != 42 else 0.0}
    with torch.no_grad():
        expected = plain.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
            min_new_tokens=8, do_sample=False,
            sequence_bias={(token,): value for token, value in bias.items()})
    request = Request("bias", prompt, W.SamplingParams(max_tokens=8, temperature=0,
                                                       ignore_eos=True, logit_bias=bias))
    events = run(engine, [request])["bias"]
    assert text(events) == tokenizer.decode(expected[0, len(prompt):])
    assert first not in expected[0, len(prompt):].tolist()
