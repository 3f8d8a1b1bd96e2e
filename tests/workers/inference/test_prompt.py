"""A worker's prompt from a chat: with `truncate`, the fewest earliest messages dropped that let
it fit (counted with the model's own chat template), a first system message and the last
message always kept; without it, the whole chat (the engine then refuses what does not fit). A
participant's name reaches the template, which shows it where it has a place for it."""

from __future__ import annotations

from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from wire import manager as W
from workers.inference.prompt import prompt_ids

TOKENIZER = AutoTokenizer.from_pretrained(resolve_model("tiny-llama"))


def chat_ids(messages: list[W.ChatMessage]) -> list[int]:
    return list(TOKENIZER.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True,
        tokenize=True, return_dict=False))


def generate(messages: list[W.ChatMessage], truncate: bool, max_tokens: int | None = 8,
             fit: bool = False) -> W.Generate:
    return W.Generate(id="r", tenant="acme", model="tiny-llama", messages=messages,
                      params=W.SamplingParams(max_tokens=max_tokens, truncate=truncate, fit=fit))


def test_a_chat_too_long_loses_its_earliest_messages_only_with_truncate() -> None:
    system = W.ChatMessage("system", "Be brief.")
    turns = [W.ChatMessage("user" if k % 2 == 0 else "assistant", f"Turn {k}: " + "word " * 40)
             for k in range(9)]
    whole = chat_ids([system, *turns])
    limit = len(whole) // 2
    assert prompt_ids(generate([system, *turns], False), TOKENIZER, limit) == whole
    made = prompt_ids(generate([system, *turns], True), TOKENIZER, limit)
    kept = next(k for k in range(1, len(turns)) if len(chat_ids([system, *turns[k:]])) + 8
                <= limit)  # one by one from the earliest, independently of the worker's search
    assert made == chat_ids([system, *turns[kept:]]) and len(made) + 8 <= limit
    assert prompt_ids(generate(turns, True), TOKENIZER, limit) == chat_ids(
        turns[next(k for k in range(1, len(turns)) if len(chat_ids(turns[k:])) + 8 <= limit):])
    tight = len(chat_ids([system, *turns[3:]])) + 1  # room for 1 token without turns 0..2
    assert prompt_ids(generate([system, *turns], True, fit=True), TOKENIZER, tight) == \
        chat_ids([system, *turns[3:]])  # a server's default max_tokens needs one token
    assert prompt_ids(generate([system, *turns], True), TOKENIZER, tight) == \
        chat_ids([system, *turns[4:]])  # max_tokens 8 needs one more turn gone


def test_a_last_message_too_long_alone_stays_whole() -> None:
    last = W.ChatMessage("user", "word " * 200)
    messages = [W.ChatMessage("system", "Be brief."), W.ChatMessage("user", "Hi"), last]
    assert prompt_ids(generate(messages, True), TOKENIZER, 50) == chat_ids([messages[0], last])


def test_a_participants_name_reaches_the_chat_template() -> None:
    named = AutoTokenizer.from_pretrained(resolve_model("tiny-llama"))
    named.chat_template = (  # a template that shows names (the built-in ones have no place)
        "{% for m in messages %}{{ m['role'] }}{% if m.name %} ({{ m.name }}){% endif %}: "
        "{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    messages = [W.ChatMessage("user", "Hi.", "ann"), W.ChatMessage("assistant", "Hello."),
                W.ChatMessage("user", "Hi again.", "bob")]
    as_sent = [{"role": "user", "content": "Hi.", "name": "ann"},
               {"role": "assistant", "content": "Hello."},
               {"role": "user", "content": "Hi again.", "name": "bob"}]
    made = prompt_ids(generate(messages, False), named)
    assert made == list(named.apply_chat_template(as_sent, add_generation_prompt=True,
                                                  tokenize=True, return_dict=False))
    assert named.decode(made).startswith("user (ann): Hi.\nassistant: Hello.\nuser (bob):")
    assert prompt_ids(generate(messages, False), TOKENIZER) == chat_ids(messages)  # no place
