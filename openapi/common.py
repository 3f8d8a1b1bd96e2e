"""Shared pieces of the public API: the base model, errors, usage, models."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

INT32 = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"contains a lone surrogate ({text[exc.start]!r}), which is not "
                         "valid Unicode") from None
    return text


Text = Annotated[str, AfterValidator(_unicode)]  # request text: valid Unicode only
TokenId = Annotated[int, Field(ge=0, le=INT32)]


def _none(value: object) -> bool:
    return value is None


def unless_none(**kwargs: Any) -> Any:
    """A response field left out while None: where OpenAI's spec allows it to be absent but not
    null (a typed client reads a null `system_fingerprint` or a chunk's null `role` as a bad
    string)."""
    return Field(default=None, exclude_if=_none, **kwargs)


class OpenAIBaseModel(BaseModel):
    """A request body: every field is declared (OpenAI's and the vendor extras honoured here);
    anything else is refused, as OpenAI refuses it, rather than silently ignored."""

    model_config = ConfigDict(extra="forbid")


class StrictModel(BaseModel):
    """Nested request objects: an unknown field there is a mistake, not a vendor extra."""

    model_config = ConfigDict(extra="forbid")


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ResponseStreamOptions(StrictModel):
    include_obfuscation: bool = Field(default=True, description=(
        "each streamed delta carries an `obfuscation` field of random characters that evens "
        "out the events' sizes, which would otherwise tell the tokens' lengths; false: none"))


class StreamOptions(ResponseStreamOptions):
    include_usage: bool = False


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    parent: str | None = Field(default=None, description="the base model of an adapter")
    root: str | None = None
    peft_type: str | None = Field(default=None, description="LORA, IA3, ADALORA, ...")
    in_service: bool = Field(default=True, description=(
        "false: no version serves it (a fine-tuned candidate that failed its quality gates; "
        "POST /v1/adapters/{model}/promote)"))
    version: int | None = Field(default=None, description=(
        "an adapter's version: the one serving the name in a listing (the heaviest of a "
        "split), the new one in a registration's reply"))


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class DeletedModel(BaseModel):
    id: str
    object: Literal["model"] = "model"
    deleted: bool
