"""POST /v1/completions: the request and response, as OpenAI defines them (plus extras)."""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, Field

from openapi.common import INT32, OpenAIBaseModel, StreamOptions, Text, TokenId, Usage
from openapi.formats import ResponseFormat

MAX_N = 8
T = TypeVar("T")
NonEmpty = Annotated[T, Field(min_length=1)]
MAX_STOP = 4


class SamplingFields(OpenAIBaseModel):
    """Fields both completion endpoints share (OpenAI's, then common vendor extras)."""

    model: Text
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Text | list[Text] | None = None
    presence_penalty: float = Field(default=0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0, ge=-2, le=2)
    seed: Annotated[int, AfterValidator(lambda seed: seed % 2**63)] | None = Field(
        default=None, description="any integer (taken modulo 2^63)")
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


class CompletionRequest(SamplingFields):
    prompt: Text | NonEmpty[list[Text]] | NonEmpty[list[TokenId]] | \
        NonEmpty[list[NonEmpty[list[TokenId]]]]
    max_tokens: int | None = Field(default=16, ge=0, le=INT32)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: Text | None = Field(default=None, description="refused: no fill-in-the-middle")
    best_of: int | None = Field(default=None, ge=1, le=MAX_N)


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
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: Usage | None = None
