"""POST /v1/responses: OpenAI's Responses API over the same models (text and function tools).

A response is stored for 30 days unless `store` is false, with the conversation it answered:
`previous_response_id` goes on from it, and it can be read again (`GET /v1/responses/{id}`, its
`input_items`) or deleted. Items this server returned may also be sent back as `input` as they
are. With `background: true` the answer is `queued` at once and runs in the gateway's
background, read by polling `GET /v1/responses/{id}` (or, streamed, followed again with
`?stream=true&starting_after=N`), stopped by `POST .../cancel`. The
features the chat endpoint lacks are refused with a 400 that names them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from openapi.common import (
    INT32,
    INT64_MAX,
    INT64_MIN,
    SERVED_TIER,
    SERVICE_TIER,
    OpenAIBaseModel,
    ResponseStreamOptions,
    StrictModel,
    Text,
)
from openapi.formats import FunctionName
from openapi.items import AskedItem, InputItem


class FunctionTool(StrictModel):
    type: Literal["function"]
    name: FunctionName
    description: Text | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="a JSON schema")
    strict: bool | None = None


class FunctionChoice(StrictModel):
    type: Literal["function"]
    name: FunctionName


class TextFormatText(StrictModel):
    type: Literal["text"]


class TextFormatJsonObject(StrictModel):
    type: Literal["json_object"]


class TextFormatJsonSchema(StrictModel):
    type: Literal["json_schema"]
    name: FunctionName
    schema_: dict[str, Any] = Field(alias="schema")
    description: Text | None = None
    strict: bool | None = None


ResponseTextFormat = Annotated[TextFormatText | TextFormatJsonObject | TextFormatJsonSchema,
                               Field(discriminator="type")]


class TextConfig(StrictModel):
    format: ResponseTextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ConversationRef(StrictModel):
    id: Text


class ResponseRequest(OpenAIBaseModel):
    model: Text
    input: Text | list[AskedItem] = Field(description=(
        "a user message, or the conversation's items: messages, function calls and their "
        "outputs (each call answered by one output naming its call_id), or references to items "
        "kept"))
    instructions: Text | None = Field(default=None, description="a system message, first")
    max_output_tokens: int | None = Field(default=None, ge=1, le=INT32)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stream: bool = False
    stream_options: ResponseStreamOptions | None = None
    tools: list[FunctionTool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    user: Text | None = None
    safety_identifier: Text | None = None
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX, description="an extra")
    # OpenAI's fields for features this server does not have: refused unless left unset
    store: bool | None = Field(default=None, description=(
        "false: the response is not kept; unset or true: kept 30 days"))
    previous_response_id: Text | None = Field(default=None, description=(
        "a stored response of this tenant's: its conversation and output come before `input`"))
    conversation: Text | ConversationRef | None = Field(default=None, description=(
        "a conversation of this tenant's (its id, or {id}): its items come before `input`, "
        "and the input and the output are added to it once the response is done; not with "
        "previous_response_id"))
    reasoning: dict[str, Any] | None = None
    include: list[Text] | None = Field(default=None, description=(
        "'message.output_text.logprobs' (the output tokens' logprobs); nothing else"))
    background: bool | None = Field(default=None, description=(
        "true: answered at once, `queued` (with `stream`: its events as they come), and run "
        "in the background (poll it with GET, or follow its events again with "
        "`?stream=true&starting_after=N`; cancel it); needs `store`"))
    metadata: dict[Text, Text] | None = Field(default=None, description=(
        "kept with the response: at most 16 pairs, keys <= 64 and values <= 512 characters"))
    prompt: dict[str, Any] | None = None
    prompt_cache_key: Text | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: Text | None = None
    max_tool_calls: int | None = None
    moderation: dict[str, Any] | None = None
    context_management: list[Any] | None = None
    background_options: dict[str, Any] | None = None
    access_programs: dict[str, Any] | None = None
    image: dict[str, Any] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20, description=(
        "the most likely tokens at each position, with their logprobs (logprobs included)"))
    truncation: Literal["auto", "disabled"] | None = Field(default=None, description=(
        "auto: a conversation too long for the context loses its earliest items (instructions "
        "stay, and the last item); disabled (the default): it is a 400"))
    service_tier: Text | None = Field(default=None, description=SERVICE_TIER)


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: dict[str, int] = Field(
        default_factory=lambda: {"cached_tokens": 0, "cache_write_tokens": 0})
    output_tokens: int
    output_tokens_details: dict[str, int] = Field(
        default_factory=lambda: {"reasoning_tokens": 0})
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    """Why a response failed (a stream that broke off: its worker lost, the service stopping);
    `code` is one of OpenAI's (the stream's `error` event carries ours)."""
    code: Literal["server_error", "rate_limit_exceeded", "invalid_prompt"]
    message: str


class Response(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[Annotated[OutputMessage | OutputFunctionCall, Field(discriminator="type")]]
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    conversation: ConversationRef | None = None
    reasoning: None = None
    store: bool = Field(default=False, description="whether it is kept (and can be gone on "
                        "from and read again)")
    background: bool = Field(default=False, description="whether it runs in the background")
    temperature: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: Any = "auto"
    tools: list[Any] = Field(default_factory=list)
    top_p: float | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    service_tier: Literal["default", "flex"] = Field(default="default", description=SERVED_TIER)
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class ResponseItemList(BaseModel):
    """A stored response's input items (those its request sent), a page of them."""
    object: Literal["list"] = "list"
    data: list[InputItem]
    first_id: str | None
    last_id: str | None
    has_more: bool


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True
