"""/v1/uploads: a file sent in parts (OpenAI's Uploads API), completed into a file."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from openapi.batches import OutputExpiresAfter
from openapi.common import OpenAIBaseModel, Text
from openapi.files import FileObject

MIME_TYPES = ("application/jsonl", "application/json", "application/x-ndjson", "text/jsonl",
              "text/plain")  # what a JSONL file is sent as


class UploadRequest(OpenAIBaseModel):
    bytes: int = Field(ge=1, description=(
        "the bytes the file will hold, all parts together; at most the largest file an upload "
        "may be (the served schema's maximum)"))
    filename: Text = Field(min_length=1, max_length=255)
    mime_type: Literal[MIME_TYPES]  # type: ignore[valid-type]
    purpose: Literal["fine-tune", "batch"]
    expires_after: OutputExpiresAfter | None = Field(default=None, description=(
        "when the file it becomes is gone, from its creation (default: kept until deleted)"))


class CompleteRequest(OpenAIBaseModel):
    part_ids: list[Text] = Field(min_length=1, max_length=10_000,
                                 json_schema_extra={"uniqueItems": True},
                                 description="the parts, in the order the file holds them")
    md5: Text | None = Field(default=None, description="the file's MD5, in hex, checked")

    @field_validator("part_ids")
    @classmethod
    def _once_each(cls, part_ids: list[str]) -> list[str]:
        if len(set(part_ids)) != len(part_ids):
            raise ValueError("a part is named more than once")
        return part_ids


class Upload(BaseModel):
    id: str
    object: Literal["upload"] = "upload"
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: Literal["pending", "completed", "cancelled", "expired"]
    file: FileObject | None = None


class UploadPart(BaseModel):
    id: str
    object: Literal["upload.part"] = "upload.part"
    created_at: int
    upload_id: str
