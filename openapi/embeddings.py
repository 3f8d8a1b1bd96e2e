"""POST /v1/embeddings: the request and response, as OpenAI defines them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field

from openapi.common import INT32, OpenAIBaseModel, Text, TokenId

MAX_INPUTS = 2048  # OpenAI's bound on an input's array


def _inputs(value: object) -> object:
    """An input that OpenAI refuses is refused naming where (pydantic's union would only say
    that a list is not a string): an empty string or list, a token id out of range, more than
    MAX_INPUTS texts or lists."""
    rows = [("input", value)] if not isinstance(value, list) or not value or \
        not isinstance(value[0], (str, list)) else \
        [(f"input[{i}]", item) for i, item in enumerate(value)]
    if len(rows) > MAX_INPUTS:
        raise ValueError(f"input has {len(rows)} items: at most {MAX_INPUTS}")
    for where, row in rows:
        if row == "" or row == []:
            raise ValueError(f"{where} is empty: every input needs at least one token")
        for j, token in enumerate(row if isinstance(row, list) else []):
            if isinstance(token, int) and not isinstance(token, bool) and \
                    not 0 <= token <= INT32:
                raise ValueError(f"{where}[{j}] is {token}: a token id is from 0 to {INT32}")
    return value


NonEmptyText = Annotated[Text, Field(min_length=1)]


class EmbeddingRequest(OpenAIBaseModel):
    input: Annotated[NonEmptyText |
                     Annotated[list[NonEmptyText], Field(min_length=1, max_length=MAX_INPUTS)] |
                     Annotated[list[TokenId], Field(min_length=1)] |
                     Annotated[list[Annotated[list[TokenId], Field(min_length=1)]],
                               Field(min_length=1, max_length=MAX_INPUTS)],
                     BeforeValidator(_inputs)] = Field(description=(
                         "a text, or up to 2048 texts, or token ids, or up to 2048 lists of "
                         "them; each within the model's context"))
    model: Text
    encoding_format: Literal["float", "base64"] = Field(default="float", description=(
        "base64: each embedding's float32 values, little-endian, as one base64 string"))
    dimensions: int | None = Field(default=None, ge=1, le=INT32, description=(
        "the embedding's first dimensions, normalized again to length 1 (at most the model's "
        "hidden size)"))
    user: Text | None = Field(default=None, description=(
        "the end user's id: logged, and the key that keeps a user on one version of a model "
        "whose traffic is split"))


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description=(
        "the last token's final hidden state through the model's adapter, of length 1; a "
        "base64 string where asked"))


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
