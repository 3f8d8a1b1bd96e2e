"""POST /v1/completions: the request and response, as OpenAI defines them (plus extras)."""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, Field

from openapi.common import (
    INT32,
    INT64_MAX,
    INT64_MIN,
    OpenAIBaseModel,
    StreamOptions,
    Text,
    TokenId,
    Usage,
    unless_none,
)
from openapi.formats import ResponseFormat

MAX_N = 128  # OpenAI's bounds; a worker's batch (`--max-batch`) bounds the sequences it runs
MAX_BEST_OF = 20
T = TypeVar("T")
NonEmpty = Annotated[T, Field(min_length=1)]
MAX_STOP = 4


class SamplingFields(OpenAIBaseModel):
    """Fields both completion endpoints share (OpenAI's, then common vendor extras)."""

    model: Text
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1, description=(
        "nucleus sampling's mass; 0 keeps the most probable token alone"))
    n: int = Field(default=1, ge=1, le=MAX_N, description=(
        "choices per prompt, up to a worker's batch (`--max-batch`, 32 by default)"))
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Text | list[Text] | None = None
    presence_penalty: float = Field(default=0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0, ge=-2, le=2)
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX,
                             description="a 64-bit signed integer: same seed, same output")
    user: Text | None = Field(default=None, description=(
        "the end user's id: logged, and the key that keeps a user on one version of a model "
        "whose traffic is split"))
    safety_identifier: Text | None = Field(default=None, description="logged, like user")
    logit_bias: dict[Text, float] | None = Field(
        default=None, description="token id (as a string) -> bias from -100 to 100")
    response_format: ResponseFormat | None = Field(
        default=None, description="JSON mode or a JSON schema (on completions: an extension)")
    # vendor extras (vLLM-style), honoured
    top_k: int | None = Field(default=None, ge=-1, le=INT32)
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0, le=INT32)


def _token_lists(prompt: object) -> object:
    """A prompt of token ids with a bad element is refused naming it (pydantic's union would
    only say that a list is not a string)."""
    if not isinstance(prompt, list):
        return prompt
    if not prompt:
        raise ValueError("the prompt is an empty list")
    rows = [(f"prompt[{i}]", p) for i, p in enumerate(prompt)] \
        if isinstance(prompt[0], list) else [("prompt", prompt)]
    for where, row in rows:
        if isinstance(row, list) and not row:
            raise ValueError(f"{where} is an empty list of token ids")
        for j, token in enumerate(row if isinstance(row, list) else []):
            if isinstance(token, int) and not isinstance(token, bool) and \
                    not 0 <= token <= INT32:
                raise ValueError(f"{where}[{j}] is {token}: a token id is from 0 to {INT32}")
    return prompt


class CompletionRequest(SamplingFields):
    prompt: Annotated[Text | NonEmpty[list[Text]] | NonEmpty[list[TokenId]] |
                      NonEmpty[list[NonEmpty[list[TokenId]]]], BeforeValidator(_token_lists)]
    max_tokens: int | None = Field(default=16, ge=0, le=INT32)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: Text | None = Field(default=None, description="refused: no fill-in-the-middle")
    best_of: int | None = Field(default=None, ge=1, le=MAX_BEST_OF)


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str | None = unless_none()
    choices: list[CompletionChoice]
    usage: Usage | None = None
