"""The items of a conversation as a client sends them (messages, function calls and their
outputs; in a request also references to items kept, `AskedItem`), shared by the Responses and
Conversations APIs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator
from pydantic_core import PydanticCustomError

from openapi.common import RefusalPart, StrictModel, Text, part_type, parts, unless_none
from openapi.formats import FunctionName


class InputText(StrictModel):
    type: Literal["input_text", "output_text"] = Field(
        description="output_text: a part of an assistant message sent back")
    text: Text
    annotations: list[Any] | None = unless_none()  # read back as sent: absent, not null
    logprobs: list[Any] | None = unless_none()

    _type = part_type("input_text", "output_text",
                      wants="'input_text', 'output_text' or 'refusal'")


MessagePart = parts(InputText, RefusalPart)


class MessageItem(StrictModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | list[MessagePart]
    id: Text | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @field_validator("type", mode="before")
    @classmethod
    def _a_type(cls, kind: object) -> object:
        """An item of another type is told every type (the others are other members)."""
        if kind != "message":
            raise PydanticCustomError("literal_error", "Input should be 'message', "
                                      "'function_call', 'function_call_output' or "
                                      "'item_reference'")
        return kind

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(
            part.refusal if isinstance(part, RefusalPart) else part.text
            for part in self.content)


class FunctionCallItem(StrictModel):
    type: Literal["function_call"]
    call_id: Text = Field(min_length=1)
    name: FunctionName
    arguments: Text = Field(description="the arguments, as a JSON object in a string")
    id: Text | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(StrictModel):
    type: Literal["function_call_output"]
    call_id: Text = Field(min_length=1, description="the call_id of the call it answers")
    output: Text | list[InputText]
    id: Text | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else \
            "".join(part.text for part in self.output)


def _item_kind(item: Any) -> str:
    kind = item.get("type", "message") if isinstance(item, dict) else \
        getattr(item, "type", "message")
    if kind == "function_call":
        return "FunctionCallItem"
    return "FunctionCallOutputItem" if kind == "function_call_output" else "MessageItem"


InputItem = Annotated[Annotated[MessageItem, Tag("MessageItem")] |
                      Annotated[FunctionCallItem, Tag("FunctionCallItem")] |
                      Annotated[FunctionCallOutputItem, Tag("FunctionCallOutputItem")],
                      Discriminator(_item_kind)]


class ItemReference(StrictModel):
    type: Literal["item_reference"]
    id: Text = Field(min_length=1, description=(
        "the id of an item kept: in what the request goes on from (its conversation, the "
        "stored response before it), else in any of the tenant's conversations and stored "
        "responses"))


def _asked_item_kind(item: Any) -> str:
    kind = item.get("type") if isinstance(item, dict) else getattr(item, "type", None)
    return "ItemReference" if kind == "item_reference" else _item_kind(item)


# a response request's input item: one given whole, or by reference to one kept
AskedItem = Annotated[Annotated[MessageItem, Tag("MessageItem")] |
                      Annotated[FunctionCallItem, Tag("FunctionCallItem")] |
                      Annotated[FunctionCallOutputItem, Tag("FunctionCallOutputItem")] |
                      Annotated[ItemReference, Tag("ItemReference")],
                      Discriminator(_asked_item_kind)]
