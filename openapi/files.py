"""/v1/files: the file object and its lists."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from openapi.common import unless_none


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None = unless_none()  # set by `expires_after` at upload
    filename: str
    purpose: str
    status: str = "processed"
    status_details: str | None = unless_none()


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool
