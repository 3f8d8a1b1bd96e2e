"""/v1/uploads: a file sent in parts (OpenAI's Uploads API): create, add a part, complete (the
parts joined in the order named, checked as `/v1/files` checks an upload, kept as a file), cancel.
A pending upload lasts an hour; its parts count in the tenant's storage until then."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, File, Request, UploadFile
from starlette.concurrency import run_in_threadpool

from gateway.deps import KnownFormFields, TenantDep
from gateway.errors import APIError, documented
from gateway.file_check import checked
from gateway.records import change
from gateway.staging import stage, staging_file
from openapi.files import FileObject
from openapi.uploads import CompleteRequest, Upload, UploadPart, UploadRequest
from state.storage import write_new
from state.uploads import UploadRecord, not_found, not_pending, parts_wrong
from wire.store import StoreAction

router = APIRouter(prefix="/v1", tags=["uploads"], responses=documented(400, 404, 409))
PART_BYTES = 64 * 2**20  # a part at most, as OpenAI's


@router.post("/uploads", response_model=Upload)
async def create_upload(body: UploadRequest, request: Request, tenant: TenantDep) -> Upload:
    """A pending upload of `bytes` bytes, at most the largest file an upload to `/v1/files`
    may be; it takes parts for an hour."""
    limit = request.app.state.settings.max_upload_bytes
    if body.bytes > limit:  # (the published schema's maximum: `schema_bounds.upload_limit`)
        raise APIError(400, f"The file is larger than the limit of {limit} bytes.",
                       "file_too_large", "bytes")
    made = await change(request.app.state.manager, StoreAction.ADD_UPLOAD, tenant.id,
                        name=body.filename, purpose=body.purpose, size=body.bytes,
                        mime_type=body.mime_type, quota_bytes=tenant.storage_quota(),
                        expires_in=body.expires_after.seconds if body.expires_after else None)
    return _public(request, _pending(request, made.made, tenant.id))


@router.post("/uploads/{upload_id}/parts", response_model=UploadPart,
             dependencies=[KnownFormFields])
async def add_upload_part(upload_id: str, request: Request, tenant: TenantDep,
                          data: Annotated[UploadFile, File()]) -> UploadPart:
    """A part of at most 64 MiB, staged and kept as it came; the parts so far may not hold more
    than the upload's `bytes`."""
    state = request.app.state
    _pending(request, upload_id, tenant.id)
    async with staging_file(state, tenant.id) as staged:
        if not await stage(data, staged, PART_BYTES):
            raise APIError(413, f"A part is larger than the limit of {PART_BYTES} bytes.",
                           "part_too_large", "data")
        made = await change(state.manager, StoreAction.ADD_PART, tenant.id, param="data",
                            upload_id=upload_id, staged=staged.name,
                            quota_bytes=tenant.storage_quota())
    part = state.upload_records.part(made.made, upload_id)
    if part is None:  # the upload was cancelled since: the part was taken, then went with it
        return UploadPart(id=made.made, created_at=int(time.time()), upload_id=upload_id)
    return UploadPart(**part.public())


@router.post("/uploads/{upload_id}/complete", response_model=Upload)
async def complete_upload(upload_id: str, body: CompleteRequest, request: Request,
                          tenant: TenantDep) -> Upload:
    """The parts named, joined in their order, become a file (checked as `/v1/files` checks
    one); they must hold the upload's `bytes` exactly, and its MD5 be `md5` where given."""
    state, upload = request.app.state, _pending(request, upload_id, tenant.id)
    records = state.upload_records
    sizes = {part.id: part.bytes for part in records.parts(upload_id)}
    wrong = parts_wrong(upload, sizes, body.part_ids)
    if wrong:
        status, code, message = wrong
        raise APIError(status, message, code, "part_ids")
    async with staging_file(state, tenant.id) as staged:
        try:
            md5 = await run_in_threadpool(join, [records.path(p) for p in body.part_ids], staged)
        except FileNotFoundError:
            _pending(request, upload_id, tenant.id)  # cancelled or expired meanwhile: its 409
            raise APIError(409, f"A part of upload {upload_id} is gone.", "invalid_part_ids",
                           "part_ids") from None
        if body.md5 is not None and body.md5.lower() != md5:
            raise APIError(400, f"The parts' MD5 is {md5}, not {body.md5}.", "md5_mismatch",
                           "md5")
        examples, format = await checked(staged, upload.purpose, state.text_tokens, None)
        made = await change(state.manager, StoreAction.COMPLETE_UPLOAD, tenant.id,
                            param="part_ids", upload_id=upload_id, part_ids=body.part_ids,
                            staged=staged.name, examples=examples, format=format)
    return _public(request, records.get(upload_id, tenant.id), made.made)


@router.post("/uploads/{upload_id}/cancel", response_model=Upload)
async def cancel_upload(upload_id: str, request: Request, tenant: TenantDep) -> Upload:
    """A pending upload ends: its parts are deleted, and no part or completion is taken."""
    _pending(request, upload_id, tenant.id)
    await change(request.app.state.manager, StoreAction.CANCEL_UPLOAD, tenant.id,
                 upload_id=upload_id)
    return _public(request, request.app.state.upload_records.get(upload_id, tenant.id))


def join(parts: list[Path], target: Path) -> str:
    """The parts written one after another to `target` (1 MiB at a time); their MD5, in hex."""
    digest = hashlib.md5(usedforsecurity=False)

    def chunks():
        for path in parts:
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
                    yield chunk

    write_new(target, chunks())
    return digest.hexdigest()


def _pending(request: Request, upload_id: str, tenant: str) -> UploadRecord:
    upload = request.app.state.upload_records.get(upload_id, tenant)
    if upload is None:
        raise APIError(404, not_found(upload_id), "upload_not_found", "upload_id")
    if upload.status_now() != "pending":
        raise APIError(409, not_pending(upload), "upload_not_pending")
    return upload


def _public(request: Request, upload: UploadRecord, file_id: str | None = None) -> Upload:
    record = request.app.state.files.get(file_id, upload.tenant) if file_id else None
    return Upload(**upload.public(), file=FileObject(**record.public()) if record else None)
