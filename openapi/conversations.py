"""Conversations (OpenAI's Conversations API): a lasting list of items that responses go on in
(`conversation` on a response request: its items come before the input, and the input and the
output are added to it once the response is done)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from openapi.common import OpenAIBaseModel, StrictModel, Text
from openapi.items import AskedItem, InputItem

LOGPROBS = "message.output_text.logprobs"
Include = list[Literal["message.output_text.logprobs"]]
METADATA = "at most 16 pairs, keys <= 64 and values <= 512 characters"


class ConversationCreate(OpenAIBaseModel):
    items: list[AskedItem] | None = Field(default=None, max_length=20, description=(
        "its first items (at most 20; more with POST .../items), or references to items kept; "
        "each is given an id of its own"))
    metadata: dict[Text, Text] | None = Field(default=None, description=METADATA)
    safety_identifier: Text | None = Field(default=None, description="logged with the request")


class Conversation(BaseModel):
    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str]


class ConversationUpdate(StrictModel):
    metadata: dict[Text, Text] | None = Field(description=(
        f"the conversation's metadata from now on (null: none); {METADATA}"))


class ConversationDeleted(BaseModel):
    id: str
    object: Literal["conversation.deleted"] = "conversation.deleted"
    deleted: bool = True


class ItemsCreate(StrictModel):
    items: list[AskedItem] = Field(min_length=1, max_length=20, description=(
        "added at the conversation's end, in order (at most 20 at a time), or references to "
        "items kept; each is given an id of its own"))


class ConversationItemList(BaseModel):
    object: Literal["list"] = "list"
    data: list[InputItem]
    first_id: str | None
    last_id: str | None
    has_more: bool
