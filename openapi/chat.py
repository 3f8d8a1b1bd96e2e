"""POST /v1/chat/completions: the request and response, as OpenAI defines them (plus extras)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, field_validator
from pydantic_core import PydanticCustomError

from openapi.common import (
    INT32,
    SERVED_TIER,
    SERVICE_TIER,
    RefusalPart,
    StrictModel,
    Text,
    Usage,
    part_type,
    parts,
    unless_none,
)
from openapi.completions import SamplingFields
from openapi.formats import FunctionName


class TextPart(StrictModel):
    type: Literal["text"]
    text: Text

    _type = part_type("text", wants="'text' (or, in an assistant message, 'refusal')")


Part = parts(TextPart, RefusalPart)


class FunctionCall(StrictModel):
    name: FunctionName
    arguments: Text = Field(description="the arguments, as a JSON object in a string")


class ToolCall(StrictModel):
    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


ROLES = ("system", "developer", "user", "assistant", "tool")


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[Part] | None = None
    refusal: Text | None = Field(default=None, description=(
        "assistant messages: a refusal the model gave, which the prompt shows as its words"))
    name: Text | None = None
    tool_calls: list[ToolCall] | None = Field(default=None, description="assistant messages")
    tool_call_id: Text | None = Field(default=None, description="(tool messages only)")
    # OpenAI's assistant fields for features this server lacks: refused when set
    # (gateway.history), never silently left out of the prompt
    audio: dict[str, Any] | None = None
    function_call: dict[str, Any] | None = None

    @field_validator("role", mode="before")
    @classmethod
    def _a_role(cls, role: object) -> object:
        """An unknown role is told every role (a tool's is another member of the union)."""
        if role not in ROLES:
            raise PydanticCustomError("literal_error", "Input should be {roles}",
                                      {"roles": f"{', '.join(map(repr, ROLES[:-1]))} or "
                                                 f"{ROLES[-1]!r}"})
        return role

    def content_text(self) -> str | None:
        """Its content as text: the string, or its parts' words in order (None: none)."""
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "".join(part.text if isinstance(part, TextPart) else part.refusal
                       for part in self.content)

    def text(self) -> str:
        """What the message says: its content's parts in order, then its refusal, if any."""
        return "\n".join(words for words in (self.content_text(), self.refusal) if words)


class ToolMessage(ChatMessage):
    """A tool's result: it names the call it answers, and has content."""

    role: Literal["tool"]
    content: Text | list[TextPart]
    tool_call_id: Text = Field(description="the id of the call this message answers")


def _message_kind(message: Any) -> str:
    role = message.get("role") if isinstance(message, dict) else getattr(message, "role", None)
    return "ToolMessage" if role == "tool" else "ChatMessage"


Message = Annotated[Annotated[ChatMessage, Tag("ChatMessage")] |
                    Annotated[ToolMessage, Tag("ToolMessage")], Discriminator(_message_kind)]


class FunctionDefinition(StrictModel):
    name: FunctionName
    description: Text | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="a JSON schema")
    strict: bool | None = None


class Tool(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(StrictModel):
    name: FunctionName


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingFields):
    messages: list[Message] = Field(min_length=1, description=(
        "the conversation; as OpenAI holds it, only assistant messages make tool calls, and "
        "each call is answered by one tool message (naming its id) before the next turn"))
    max_tokens: int | None = Field(default=None, ge=0, le=INT32, description="deprecated alias")
    max_completion_tokens: int | None = Field(default=None, ge=0, le=INT32)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = Field(default=None, description=(
        "with tools: whether the model may call several functions at once (default true; a "
        "named tool_choice is always one call)"))
    store: bool | None = Field(default=None, description=(
        "keep the completion with its messages and metadata (30 days), to list, read, tag "
        "anew or delete at /v1/chat/completions"))
    metadata: dict[Text, Text] | None = Field(default=None, description=(
        "a stored completion's tags (with store: true): at most 16 pairs, keys <= 64 and "
        "values <= 512 characters"))
    service_tier: str | None = Field(default=None, description=SERVICE_TIER)
    # OpenAI's fields for features this server does not have: refused unless left at their
    # default (gateway.sampling.refuse_unsupported), never silently ignored
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    moderation: dict[str, Any] | None = None
    functions: list[Any] | None = Field(default=None, description="deprecated: use tools")
    function_call: Any = Field(default=None, description="deprecated: use tool_choice")


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None  # (no refusals here; OpenAI's always has the key)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = unless_none()


FinishReason = Literal["stop", "length", "tool_calls"]


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None = unless_none()
    service_tier: Literal["default", "flex"] | None = unless_none(description=SERVED_TIER)
    choices: list[ChatChoice]
    usage: Usage | None = None


class FunctionCallDelta(BaseModel):
    name: str | None = unless_none()
    arguments: str | None = unless_none()


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = unless_none()
    type: Literal["function"] | None = unless_none()
    function: FunctionCallDelta | None = unless_none()


class Delta(BaseModel):
    role: Literal["assistant"] | None = unless_none()
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = unless_none()


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = unless_none()
    service_tier: Literal["default", "flex"] | None = unless_none(description=SERVED_TIER)
    choices: list[ChunkChoice]
    usage: Usage | None = None
