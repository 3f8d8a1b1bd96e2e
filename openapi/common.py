"""Shared pieces of the public API: the base model, errors, usage, models."""

from __future__ import annotations

import functools
import operator
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
)
from pydantic_core import PydanticCustomError

INT32 = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
SERVICE_TIER = ("auto or default: served as it comes; flex: behind every interactive request (a "
                "lower priority; its tenant's latency targets do not apply); other tiers are "
                "refused")
SERVED_TIER = "the tier that served it (flex: behind every interactive request, as it asked)"


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


def parts(first: type[BaseModel], *others: type[BaseModel]) -> Any:
    """A union of content parts told apart by their `type`: a part of any other type (or none)
    is `first`'s, whose `type` check (`part_type`) names what each member takes."""
    tags = {m.model_fields["type"].annotation.__args__[0]: m.__name__ for m in others}

    def kind(part: Any) -> str:
        got = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
        return tags[got] if isinstance(got, str) and got in tags else first.__name__

    members = [Annotated[m, Tag(m.__name__)] for m in (first, *others)]
    return Annotated[functools.reduce(operator.or_, members), Discriminator(kind)]


def part_type(*kinds: str, wants: str) -> Any:
    """A content part's check of its `type`, one of `kinds`: any other is told `wants` (the
    types of every member of its union)."""

    def check(cls, kind: object) -> object:
        if not (isinstance(kind, str) and kind in kinds):
            raise PydanticCustomError("literal_error", f"Input should be {wants}")
        return kind

    return field_validator("type", mode="before")(check)


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


class RefusalPart(StrictModel):
    """An assistant's refusal, sent back in a conversation."""

    type: Literal["refusal"]
    refusal: Text


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
