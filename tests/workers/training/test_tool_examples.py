"""Fine-tuning on tool calls: an example's tools, calls and results become the very text the
gateway sends a worker for the same conversation (so a model is tuned on what it is served),
its calls are learned like assistant text, a participant's name goes with its message as
served, and the deprecated function-calling form reads the same; a malformed call is refused
naming its message."""

from __future__ import annotations

import json

import pytest
from pydantic import TypeAdapter, ValidationError
from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from gateway.tools import worker_messages
from openapi.chat import ChatCompletionRequest
from openapi.formats import FunctionName
from state.training_file import BadLine, parse
from wire.hermes import FUNCTION_NAME
from workers.training.data import IGNORE, chat_example

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    {"role": "assistant", "content": "Sunny, 21 C."}]


def served(messages: list[dict], tools: list[dict]) -> list[tuple[str, str]]:
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": messages,
                                                    "tools": tools})
    return [(m.role, m.content) for m in worker_messages(request)]


def trained(record: dict) -> list[tuple[str, str]]:
    return [(t.role, t.text) for t in parse(json.dumps(record)).turns]


@pytest.mark.parametrize("system", [True, False])
def test_an_example_reads_as_the_same_conversation_is_served(system: bool) -> None:
    messages = CONVERSATION if system else CONVERSATION[1:]
    turns = trained({"messages": messages, "tools": [WEATHER], "parallel_tool_calls": False})
    assert turns == served(messages, [WEATHER])
    assert "<tool_call>" in turns[-3][1] and "get_weather" in turns[0][1]


def test_a_participants_name_reads_as_served_and_reaches_the_template() -> None:
    messages = [{"role": "system", "content": "Be brief.", "name": "house"},
                {"role": "user", "content": "Hi.", "name": "ann"},
                {"role": "assistant", "content": "Hello.", "name": "bot"},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                {"role": "assistant", "content": "Sunny."}]
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": messages,
                                                    "tools": [WEATHER]})
    turns = parse(json.dumps({"messages": messages, "tools": [WEATHER]})).turns
    assert [(t.role, t.text, t.name) for t in turns] == \
        [(m.role, m.content, m.name) for m in worker_messages(request)]
    named = AutoTokenizer.from_pretrained(resolve_model("tiny-llama"))
    named.chat_template = (  # a template that shows names (the built-in ones have no place)
        "{% for m in messages %}{{ m['role'] }}{% if m.name %} ({{ m.name }}){% endif %}: "
        "{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    ids, _ = chat_example(turns, named)
    assert named.decode(ids).startswith("system (house): Be brief.")
    assert "\nuser (ann): Hi.\nassistant (bot): Hello.\nuser: Weather?\n" in named.decode(ids)
    with pytest.raises(BadLine, match="name that is not a string"):
        parse(json.dumps({"messages": [{**messages[1], "name": 7}, messages[2]]}))


def test_the_deprecated_function_calling_form_reads_the_same() -> None:
    old = [*CONVERSATION[:2],
           {"role": "assistant", "content": None, "function_call": CALL["function"]},
           {"role": "function", "name": "get_weather", "content": "sunny, 21 C"},
           CONVERSATION[-1]]
    assert trained({"messages": old, "functions": [WEATHER["function"]]}) == \
        trained({"messages": CONVERSATION, "tools": [WEATHER]})


def test_a_call_is_learned_and_its_result_is_not() -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny-llama"))
    turns = parse(json.dumps({"messages": CONVERSATION, "tools": [WEATHER]})).turns
    ids, labels = chat_example(turns, tokenizer)
    learned = tokenizer.decode([i for i, label in zip(ids, labels, strict=True)
                                if label != IGNORE])
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert learned == f"{call}<|im_end|>\nSunny, 21 C.<|im_end|>\n"
    assert "sunny, 21 C" not in learned and "<tools>" not in learned


@pytest.mark.parametrize(("change", "says"), [
    ({"tool_calls": [{**CALL, "function": {**CALL["function"], "arguments": "{oops"}}]},
     "message 3's tool call 0's arguments must be a JSON object in a string"),
    ({"tool_calls": [{**CALL, "function": {"arguments": "{}"}}]},
     "message 3's tool call 0 needs a function name"),
    ({"tool_calls": []}, "message 3's tool_calls must be a non-empty list"),
    ({"function_call": CALL["function"]}, "message 3 has both 'tool_calls' and"),
])
def test_a_malformed_call_is_refused_naming_its_message(change: dict, says: str) -> None:
    messages = [*CONVERSATION[:2], {**CONVERSATION[2], **change}, *CONVERSATION[3:]]
    with pytest.raises(BadLine, match=says.replace("(", r"\(")):
        parse(json.dumps({"messages": messages, "tools": [WEATHER]}))


@pytest.mark.parametrize(("record", "says"), [
    ({"tools": [WEATHER], "functions": [WEATHER["function"]]}, "both 'tools' and 'functions'"),
    ({"tools": [{"type": "retrieval"}]}, "tool 0 must be"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tool 0's function needs"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}] * 2}, "tool 1 names a function"),
    ({"tools": [{"type": "function", "function": {"name": "f", "code": "x"}}]},
     "tool 0's function takes only name, description, parameters, strict"),
])
def test_malformed_tools_are_refused(record: dict, says: str) -> None:
    with pytest.raises(BadLine, match=says):
        parse(json.dumps({"messages": CONVERSATION, **record}))


@pytest.mark.parametrize(("change", "says"), [
    ({3: {**CONVERSATION[3], "tool_call_id": "call_2"}},
     "message 4 answers tool call 'call_2', which the assistant message before it did not"),
    ({3: {**CONVERSATION[3], "tool_call_id": 7}}, "message 4's tool_call_id must be a string"),
    ({2: {**CONVERSATION[2], "tool_calls": [
        {**CALL, "function": {**CALL["function"], "name": "get_time"}}]}},
     "message 3's tool call 0 calls 'get_time', which the example's tools do not list"),
])
def test_calls_and_results_must_match_as_in_a_served_chat(change: dict, says: str) -> None:
    """What a served chat refuses (gateway.history) and what the served model's calls are
    read against (its tools): a result for a call not made, a call to an unlisted function."""
    messages = [change.get(i, m) for i, m in enumerate(CONVERSATION)]
    with pytest.raises(BadLine, match=says):
        parse(json.dumps({"messages": messages, "tools": [WEATHER]}))
    unnamed = {**CONVERSATION[2], "tool_calls": [{k: v for k, v in CALL.items() if k != "id"}]}
    assert parse(json.dumps({"messages": [*CONVERSATION[:2], unnamed, *CONVERSATION[3:]],
                             "tools": [WEATHER]}))  # calls without ids answer as they can


def test_only_an_assistant_message_makes_calls() -> None:
    messages = [{**CONVERSATION[1], "tool_calls": [CALL]}, CONVERSATION[-1]]
    with pytest.raises(BadLine, match="message 1 has tool calls, which only an assistant"):
        parse(json.dumps({"messages": messages}))


def test_a_function_name_follows_the_apis_rule() -> None:
    """wire.hermes.FUNCTION_NAME (the training file's check) and the API's FunctionName (the
    contract imports no project code) accept and refuse the same names."""
    api = TypeAdapter(FunctionName)
    for name in ("get_weather", "A-1", "x" * 64, "x" * 65, "", "a b", "f\n", "é", "a.b"):
        try:
            api.validate_python(name)
            allowed = True
        except ValidationError:
            allowed = False
        assert bool(FUNCTION_NAME.fullmatch(name)) == allowed, name
