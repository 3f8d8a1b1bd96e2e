"""Stored chat completions (`store: true` on a chat request): the list, a completion read back,
its messages, new metadata and the deletion, as OpenAI defines them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from openapi.chat import ChatCompletionResponse, ToolCall
from openapi.common import StrictModel, Text, unless_none


class StoredChatCompletion(ChatCompletionResponse):
    metadata: dict[str, str] = Field(default_factory=dict)


class ChatCompletionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[StoredChatCompletion]
    first_id: str | None
    last_id: str | None
    has_more: bool


class StoredMessage(BaseModel):
    """A message of the request a stored completion answered: its text as `content` and, if it
    was sent as parts, those parts as `content_parts`."""

    id: str = Field(description="`<completion id>-<index>`")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None
    content_parts: list[dict[str, Any]] | None = None
    refusal: str | None = unless_none()
    name: str | None = unless_none()
    tool_calls: list[ToolCall] | None = unless_none()
    tool_call_id: str | None = unless_none()


class StoredMessageList(BaseModel):
    object: Literal["list"] = "list"
    data: list[StoredMessage]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ChatCompletionUpdate(StrictModel):
    metadata: dict[Text, Text] | None = Field(description=(
        "the completion's metadata from now on (null: none); at most 16 pairs, keys <= 64 "
        "and values <= 512 characters"))


class ChatCompletionDeleted(BaseModel):
    id: str
    object: Literal["chat.completion.deleted"] = "chat.completion.deleted"
    deleted: bool = True
