"""POST /v1/responses/input_tokens: how many tokens a response request's input comes to, as
the model would read it (instructions, tools, the conversation it goes on from, truncation)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from openapi.common import OpenAIBaseModel, Text
from openapi.items import AskedItem
from openapi.responses import ConversationRef, FunctionChoice, FunctionTool, TextConfig


class InputTokensRequest(OpenAIBaseModel):
    model: Text  # required, as a response's (the SDK leaves it optional)
    input: Text | list[AskedItem] | None = None
    instructions: Text | None = None
    previous_response_id: Text | None = None
    tools: list[FunctionTool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None
    conversation: Text | ConversationRef | None = None
    # OpenAI's fields for features this server does not have: refused unless left unset
    reasoning: dict[str, Any] | None = None
    personality: Text | None = None


class InputTokenCount(BaseModel):
    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int
