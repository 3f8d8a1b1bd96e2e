"""A request's prompt as token ids: given as ids, as text, or as a chat rendered by the
tokenizer's template (its earliest messages dropped where it asks to fit)."""

from __future__ import annotations

from typing import Any

from wire import manager as W


def prompt_ids(message: W.Generate, tokenizer: Any, limit: int | None = None) -> list[int]:
    """The prompt's token ids; a chat with `truncate` loses its earliest messages (a first
    system message stays, and the last message) until it leaves room within `limit` for its
    max_tokens (for a server's default, one token)."""
    if message.prompt_ids is not None:
        return list(message.prompt_ids)
    if message.messages is not None:
        chat = [{"role": m.role, "content": m.content, **({"name": m.name} if m.name else {})}
                for m in message.messages]
        ids = _chat_ids(chat, tokenizer)
        params, first = message.params, int(bool(chat) and chat[0]["role"] == "system")
        need = 1 if params.fit or params.max_tokens is None else params.max_tokens
        if params.truncate and limit and len(ids) + need > limit and len(chat) - first > 1:
            return _truncated(chat, first, tokenizer, limit - need)
        return ids
    ids = tokenizer.encode(message.prompt or "")
    # an empty prompt generates "as if from the beginning of a new document" (OpenAI's words)
    return ids or [tokenizer.bos_token_id if tokenizer.bos_token_id is not None
                   else tokenizer.eos_token_id]


def _truncated(chat: list[dict], first: int, tokenizer: Any, room: int) -> list[int]:
    """The chat's ids without the fewest of its earliest messages (from `first`) that leave
    it within `room` tokens, or without all but its last (a prompt fewer messages make no
    longer: a binary search, a few renderings however long the chat)."""
    def without(k: int) -> list[int]:
        return _chat_ids(chat[:first] + chat[first + k:], tokenizer)

    low, high = 1, len(chat) - first - 1
    while low < high:
        middle = (low + high) // 2
        if len(without(middle)) <= room:
            high = middle
        else:
            low = middle + 1
    return without(low)


def _chat_ids(chat: list[dict], tokenizer: Any) -> list[int]:
    return list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))
