"""A worker's prompt from a chat: with `truncate`, the fewest earliest messages dropped that let
it fit (counted with the model's own chat template), a first system message and the last
message always kept; without it, the whole chat (the engine then refuses what does not fit)."""

from __future__ import annotations

from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from wire import manager as W
from workers.inference.worker import prompt_ids

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
