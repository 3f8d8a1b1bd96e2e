"""/v1/files: upload (validated fine-tuning JSONL, or a batch's requests), list, retrieve,
content, delete."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Annotated, BinaryIO, Literal

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import Response, StreamingResponse

from gateway.deps import KnownFormFields, TenantDep
from gateway.errors import APIError, documented
from gateway.file_check import checked
from gateway.records import change
from gateway.staging import stage, staging_file
from openapi.files import FileDeleted, FileList, FileObject
from wire.store import StoreAction

router = APIRouter(prefix="/v1", tags=["files"],
                   responses=documented(400, 404, 409))


ExpiresAnchor = Annotated[Literal["created_at"], Form(alias="expires_after[anchor]")]
ExpiresSeconds = Annotated[int, Form(alias="expires_after[seconds]", ge=3600, le=30 * 24 * 3600)]


def _not_found(file_id: str) -> APIError:
    return APIError(404, f"No such File object: {file_id}", "file_not_found", "id")


@router.post("/files", response_model=FileObject, dependencies=[KnownFormFields])
async def upload_file(request: Request, tenant: TenantDep, file: Annotated[UploadFile, File()],
                      purpose: Annotated[Literal["fine-tune", "batch"], Form()],
                      anchor: ExpiresAnchor = "created_at",
                      seconds: ExpiresSeconds = None) -> FileObject:
    """Streamed to a staging file beside the others, validated line by line from there, then
    kept (never held in memory whole); a tenant uploads `max_concurrent_uploads` at a time.
    With `expires_after[seconds]` it is gone that many seconds after its creation (the
    anchor, `created_at`, is the only one)."""
    state = request.app.state
    limit = state.settings.max_upload_bytes
    async with staging_file(state, tenant.id) as staged:
        if not await stage(file, staged, limit):
            raise APIError(413, f"The file is larger than the limit of {limit} bytes.",
                           "file_too_large", "file")
        examples, format = await checked(staged, purpose, state.text_tokens)
        made = await change(state.manager, StoreAction.ADD_FILE, tenant.id, param="file",
                            name=file.filename or "upload.jsonl", purpose=purpose,
                            staged=staged.name, examples=examples, format=format,
                            expires_in=seconds, quota_bytes=tenant.storage_quota())
    return FileObject(**state.files.get(made.made, tenant.id).public())


@router.get("/files", response_model=FileList)
async def list_files(request: Request, tenant: TenantDep, purpose: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=10000)] = 10000,
                     after: str | None = None,
                     order: Literal["asc", "desc"] = "desc") -> FileList:
    records, more = request.app.state.files.list(tenant.id, purpose=purpose, after=after,
                                                 limit=limit, order=order)
    data = [FileObject(**r.public()) for r in records]
    return FileList(data=data, first_id=data[0].id if data else None,
                    last_id=data[-1].id if data else None, has_more=more)


@router.get("/files/{file_id}", response_model=FileObject)
async def retrieve_file(file_id: str, request: Request, tenant: TenantDep) -> FileObject:
    record = request.app.state.files.get(file_id, tenant.id)
    if record is None:
        raise _not_found(file_id)
    return FileObject(**record.public())


CONTENT = {200: {"description": "The file's bytes: an uploaded JSONL file or a job's results",
                 "content": {"application/jsonl": {"schema": {"type": "string"}},
                             "text/csv": {"schema": {"type": "string"}}}}}


@router.get("/files/{file_id}/content", response_class=Response, responses=CONTENT)
async def file_content(file_id: str, request: Request, tenant: TenantDep) -> Response:
    record = request.app.state.files.get(file_id, tenant.id)
    if record is None:
        raise _not_found(file_id)
    media = "text/csv" if record.filename.endswith(".csv") else "application/jsonl"
    try:  # open now: a delete meanwhile leaves what is open readable to the end
        f = open(record.path, "rb")  # noqa: SIM115 (closed by `_chunks`)
    except FileNotFoundError:  # deleted since it was looked up
        raise _not_found(file_id) from None
    return StreamingResponse(_chunks(f), media_type=media,
                             headers={"content-length": str(os.fstat(f.fileno()).st_size)})


def _chunks(f: BinaryIO) -> Iterator[bytes]:
    """The file 1 MiB at a time (read by a worker thread: starlette iterates a plain iterator
    in its thread pool), closed at the end or when the client leaves."""
    with f:
        while chunk := f.read(1 << 20):
            yield chunk


@router.delete("/files/{file_id}", response_model=FileDeleted)
async def delete_file(file_id: str, request: Request, tenant: TenantDep) -> FileDeleted:
    if request.app.state.files.get(file_id, tenant.id) is None:
        raise _not_found(file_id)
    await change(request.app.state.manager, StoreAction.DELETE_FILE, tenant.id, param="file_id",
                 file_id=file_id)
    return FileDeleted(id=file_id, deleted=True)
