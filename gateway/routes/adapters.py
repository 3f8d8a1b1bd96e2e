"""POST /v1/adapters: register a PEFT adapter (multipart upload of its two files)."""

from __future__ import annotations

import contextlib
import re
import shutil
import uuid
from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, File, Form, Request, UploadFile
from starlette.concurrency import run_in_threadpool

from gateway.deps import KnownFormFields, TenantDep
from gateway.errors import APIError, documented
from gateway.records import change
from gateway.serving import Target
from gateway.staging import stage
from gateway.tenants import Tenant
from openapi.common import Model
from state.versions import VersionRecord, split_id
from wire import manager as W
from wire.store import ADAPTER_NAME, ADAPTER_NAME_RULE, StoreAction

router = APIRouter(prefix="/v1", tags=["adapters"],
                   responses=documented(400, 422))


@router.post("/adapters", response_model=Model, status_code=201,
             dependencies=[KnownFormFields])
async def register_adapter(request: Request, tenant: TenantDep,
                           name: Annotated[str, Form(description=ADAPTER_NAME_RULE,
                                                     json_schema_extra={"pattern": ADAPTER_NAME})],
                           adapter_config: Annotated[UploadFile, File()],
                           adapter_model: Annotated[UploadFile, File()],
                           promote: Annotated[bool, Form()] = True) -> Model:
    """Register an adapter: a new model, or the next immutable version of the tenant's model of
    that name, which serves the name as soon as a worker has loaded it (422 and nothing stored
    if it does not load; the name serves as before) unless `promote` is false (then see
    /v1/adapters/{model}/promote and /split)."""
    if not re.fullmatch(ADAPTER_NAME, name):  # checked here to say it in words
        raise APIError(400, f"Adapter names use {ADAPTER_NAME_RULE}: not {name[:80]!r}.",
                       "invalid_request", "name")
    state = request.app.state
    limit = state.settings.max_upload_bytes
    async with state.uploads.slot(tenant.id):
        staged = state.registry.staging()
        try:
            for upload, filename in ((adapter_config, "adapter_config.json"),
                                     (adapter_model, "adapter_model.safetensors")):
                if not await stage(upload, staged / filename, limit):
                    raise APIError(413, f"{filename} is larger than {limit} bytes",
                                   "file_too_large")
            made = await change(state.manager, StoreAction.ADD_ADAPTER, tenant.id, name=name,
                                staged=staged.name, serve=promote, hold=promote,
                                quota_bytes=tenant.storage_quota())
        finally:
            await run_in_threadpool(shutil.rmtree, staged, ignore_errors=True)
    model, number = split_id(made.made)
    version = state.registry.versions.get(model, number)
    if promote:  # it serves the name only once a worker has loaded it
        try:
            await loads_in_a_worker(state, tenant, version)
        except APIError as exc:
            with contextlib.suppress(APIError):  # a held version that stays never serves
                await change(state.manager, StoreAction.WITHDRAW, tenant.id, model=model,
                             number=number)
            if exc.code != "adapter_load_failed":  # the manager or executor down: retry later
                raise
            raise APIError(422, f"The adapter did not load in a worker, so nothing was stored "
                           f"and {version.model} serves as before: {exc.message}",
                           "adapter_load_failed", "adapter_model") from None
        await change(state.manager, StoreAction.PROMOTE, tenant.id, model=model, number=number)
    return Model(id=version.model, created=version.created, owned_by=tenant.id,
                 parent=state.registry.base, root=state.registry.base,
                 peft_type=version.peft_type, in_service=promote, version=version.number)


async def loads_in_a_worker(state, tenant: Tenant, version: VersionRecord) -> None:
    """A worker loads the version and runs one prefill token (no fallback to the base model);
    APIError saying why when it does not."""
    target = Target(version.id, W.AdapterRef(version.path, version.peft_type))
    run = await state.serving.start(replace(tenant, fallback=False), target,
                                    f"load-{uuid.uuid4().hex[:12]}", [{"prompt_ids": [0]}],
                                    W.SamplingParams(max_tokens=0))
    await run.collect()
