"""/v1/batches: a tenant's file of requests (uploaded with purpose "batch") run in the background
by `gateway.batch_runner`, its results then in an output and an error file; create, retrieve,
list, cancel (OpenAI's Batch API)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from gateway.batch_file import InvalidBatchFile, read_batch_file
from gateway.deps import TenantDep
from gateway.errors import APIError, check_metadata, documented
from gateway.pages import page
from gateway.records import change
from openapi.batches import Batch, BatchList, BatchRequest
from state.batches import BatchReader, BatchRecord
from wire.store import StoreAction

router = APIRouter(prefix="/v1", tags=["batches"], responses=documented(400, 404))


@router.post("/batches", response_model=Batch)
async def create_batch(body: BatchRequest, request: Request, tenant: TenantDep) -> dict:
    state = request.app.state
    check_metadata(body.metadata)
    source = state.files.get(body.input_file_id, tenant.id)
    if source is None:
        raise APIError(404, f"No such File object: {body.input_file_id}", "file_not_found",
                       "input_file_id")
    if source.purpose != "batch":
        raise APIError(400, f"File {source.id} was uploaded with purpose '{source.purpose}'; a "
                       "batch's input is uploaded with purpose 'batch'.", "invalid_value",
                       "input_file_id")
    try:
        checked = await run_in_threadpool(read_batch_file, Path(source.path))
    except InvalidBatchFile as exc:
        raise APIError(400, f"Invalid batch file: {exc}", "invalid_file_format",
                       "input_file_id") from None
    if checked.url != body.endpoint:
        raise APIError(400, f"The input file's requests go to {checked.url}, not to the "
                       f"batch's endpoint {body.endpoint}.", "invalid_value", "endpoint")
    batch_id = f"batch_{uuid.uuid4().hex}"
    await change(state.manager, StoreAction.ADD_BATCH, tenant.id, param="input_file_id",
                 record=json.dumps({"id": batch_id, "endpoint": body.endpoint,
                                    "input_file_id": source.id, "total": checked.requests,
                                    "model": checked.model,
                                    "metadata": body.metadata,
                                    "output_expires_s": body.output_expires_after and
                                    body.output_expires_after.seconds}))
    state.batch_runner.wake()
    return _found(state.batches, tenant.id, batch_id).body


@router.get("/batches/{batch_id}", response_model=Batch)
async def retrieve_batch(batch_id: str, request: Request, tenant: TenantDep) -> dict:
    return _found(request.app.state.batches, tenant.id, batch_id).body


@router.post("/batches/{batch_id}/cancel", response_model=Batch)
async def cancel_batch(batch_id: str, request: Request, tenant: TenantDep) -> dict:
    """A running batch stops taking new requests (status `cancelling`), then ends `cancelled`
    with the results so far in its files; any other batch is returned as it is."""
    state = request.app.state
    await change(state.manager, StoreAction.CANCEL_BATCH, tenant.id, param="batch_id",
                 batch_id=batch_id)
    state.batch_runner.wake()
    return _found(state.batches, tenant.id, batch_id).body


@router.get("/batches", response_model=BatchList)
async def list_batches(request: Request, tenant: TenantDep, after: str | None = None,
                       limit: Annotated[int, Query(ge=1, le=100)] = 20) -> dict:
    found, more = request.app.state.batches.list(tenant.id, after=after, limit=limit)
    return page([b.body for b in found], more)


def _found(batches: BatchReader, tenant: str, batch_id: str) -> BatchRecord:
    batch = batches.get(batch_id, tenant)
    if batch is None:
        raise APIError(404, f"No batch found with id '{batch_id}'.", "batch_not_found",
                       "batch_id")
    return batch
