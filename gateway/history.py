"""What a conversation must be before the model reads it, as OpenAI's chat API holds it: only
the assistant calls tools, every call is answered by tool messages right after it, and every
tool message answers one of those calls."""

from __future__ import annotations

from gateway.errors import APIError, unsupported_parameter
from openapi.chat import ChatMessage
from openapi.common import RefusalPart


def check_history(messages: list[ChatMessage]) -> None:
    asker, unanswered = 0, []  # the last message that made calls, and its calls not answered
    for i, message in enumerate(messages):
        if message.role == "tool":
            _check_words(i, message)
            _answer(i, message, unanswered)
            continue
        if unanswered:
            raise _unanswered(asker, unanswered)
        _check_message(i, message)
        asker, unanswered = i, [call.id for call in message.tool_calls or []]
        if len(set(unanswered)) < len(unanswered):
            raise _refusal(f"messages.{i}.tool_calls", "two of its tool calls share an id: each "
                           "call needs its own, for its tool message to name")
    if unanswered:
        raise _unanswered(asker, unanswered)


def _check_message(i: int, message: ChatMessage) -> None:
    if message.tool_call_id is not None:
        raise _refusal(f"messages.{i}.tool_call_id", f"a {message.role} message answers no "
                       "call: only a tool message has a tool_call_id")
    if message.tool_calls is not None and message.role != "assistant":
        raise _refusal(f"messages.{i}.tool_calls", f"a {message.role} message cannot make "
                       "tool calls: only an assistant message does")
    if message.role != "assistant":
        _check_words(i, message)
    if message.audio is not None:
        raise unsupported_parameter(f"messages.{i}.audio", "this server has no audio to refer "
                                    "to (it generates text only)")
    if message.function_call is not None:
        raise unsupported_parameter(f"messages.{i}.function_call", "send the call as "
                                    "'tool_calls' (the deprecated 'function_call' is not "
                                    "accepted)")


def _check_words(i: int, message: ChatMessage) -> None:
    """Only the model refuses: a refusal is an assistant message's part or field."""
    if message.refusal is not None:
        raise _refusal(f"messages.{i}.refusal", f"a {message.role} message has no refusal: "
                       "only an assistant message does")
    parts = message.content if isinstance(message.content, list) else []
    for k, part in enumerate(parts):
        if isinstance(part, RefusalPart):
            raise _refusal(f"messages.{i}.content.{k}.type", f"a {message.role} message's "
                           "content has text parts only: a refusal part is an assistant's")
    if message.content is None:
        raise APIError(400, f"Missing required parameter: 'messages.{i}.content'.",
                       "invalid_request", f"messages.{i}.content")


def _answer(i: int, message: ChatMessage, unanswered: list[str]) -> None:
    if message.tool_call_id not in unanswered:
        raise _refusal(f"messages.{i}.tool_call_id", f"'{message.tool_call_id}' is not the id "
                       "of an unanswered tool call of the assistant message before it (a tool "
                       "message answers one such call, once)")
    unanswered.remove(message.tool_call_id)


def _unanswered(i: int, ids: list[str]) -> APIError:
    return APIError(400, "An assistant message with 'tool_calls' must be followed by tool "
                    "messages responding to each 'tool_call_id'. The following tool_call_ids "
                    f"did not have response messages: {', '.join(ids)}", "invalid_request",
                    f"messages.{i}.tool_calls")


def _refusal(param: str, why: str) -> APIError:
    return APIError(400, f"Invalid value for '{param}': {why}.", "invalid_request", param)
