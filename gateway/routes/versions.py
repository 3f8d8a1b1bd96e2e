"""Extension: a model's versions, and which serve its name (promote, rollback, traffic split).

Requests switch versions from their next resolution on; requests in flight finish on the version
they started with (each version runs in its own worker, which idles out when no longer used).
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Path, Request

from gateway.deps import TenantDep
from gateway.errors import documented, model_not_found
from gateway.records import change
from openapi.versions import (
    AdapterVersion,
    AdapterVersionList,
    DeletedVersion,
    PromoteRequest,
    SplitRequest,
    VersionWeight,
)
from state.adapters import AdapterReader, AdapterRecord
from state.versions import weights
from wire import manager as W
from wire.store import StoreAction

router = APIRouter(prefix="/v1/adapters", tags=["adapters"], responses=documented(400, 404, 409))


def listing(registry: AdapterReader, record: AdapterRecord) -> AdapterVersionList:
    split = dict(weights(record.serving))
    data = [AdapterVersion(id=v.id, model=v.model, version=v.number, created_at=v.created,
                           peft_type=v.peft_type, source=v.source, job_id=v.job_id,
                           passed_gates=bool(v.passed_gates), weight=split.get(v.number, 0),
                           lineage=json.loads(v.lineage))
            for v in registry.versions.list(record.id)]
    return AdapterVersionList(model=record.id, data=data, can_roll_back=record.history != "[]",
                              serving=[VersionWeight(version=n, weight=w)
                                       for n, w in weights(record.serving)])


def _owned(request: Request, tenant_id: str, model: str) -> AdapterRecord:
    record = request.app.state.registry.visible(model, tenant_id)
    if record is None:
        raise model_not_found(model)
    return record


async def _changed(request: Request, record: AdapterRecord, action: StoreAction,
                   param: str | None = "version", **fields) -> AdapterVersionList:
    """The change made, and the versions that now serve loaded ahead of their first request;
    a refusal names `param` (the request's field in question)."""
    state = request.app.state
    await change(state.manager, action, record.tenant, param=param, model=record.id, **fields)
    changed = state.registry.get(record.id)
    for number, _ in weights(changed.serving):
        version = state.registry.versions.get(record.id, number)
        if version is not None:
            await state.manager.send(W.Prefetch(
                record.tenant, version.id, W.AdapterRef(version.path, version.peft_type)))
    return listing(state.registry, changed)


@router.get("/{model:path}/versions", response_model=AdapterVersionList)
async def list_versions(model: str, request: Request, tenant: TenantDep) -> AdapterVersionList:
    """Every version of a model with its lineage, and the split that serves the name."""
    return listing(request.app.state.registry, _owned(request, tenant.id, model))


@router.post("/{model:path}/promote", response_model=AdapterVersionList)
async def promote(model: str, request: Request, tenant: TenantDep,
                  body: PromoteRequest | None = None) -> AdapterVersionList:
    """Serve one version (the latest by default, also without a body) with all of the name's
    traffic."""
    record = _owned(request, tenant.id, model)
    number = body.version if body is not None else None
    return await _changed(request, record, StoreAction.PROMOTE, number=number)


@router.post("/{model:path}/rollback", response_model=AdapterVersionList)
async def rollback(model: str, request: Request, tenant: TenantDep) -> AdapterVersionList:
    """Serve what served before the last promote, split or rollback's change."""
    return await _changed(request, _owned(request, tenant.id, model), StoreAction.ROLLBACK,
                          param=None)  # it has no body


@router.post("/{model:path}/split", response_model=AdapterVersionList)
async def split(model: str, body: SplitRequest, request: Request,
                tenant: TenantDep) -> AdapterVersionList:
    """Split the name's traffic between versions by weight (sticky per request `user`)."""
    record = _owned(request, tenant.id, model)
    return await _changed(request, record, StoreAction.SPLIT, param="weights",
                          split=[[w.version, w.weight] for w in body.weights])


@router.delete("/{model:path}/versions/{number}", response_model=DeletedVersion)
async def delete_version(model: str, number: Annotated[int, Path(ge=1, le=999_999_999)],
                         request: Request,
                         tenant: TenantDep) -> DeletedVersion:
    """Delete a version that does not serve the name."""
    record = _owned(request, tenant.id, model)
    done = await change(request.app.state.manager, StoreAction.DELETE_VERSION, tenant.id,
                        param="version", model=record.id, number=number)
    return DeletedVersion(id=done.deleted[0], deleted=True)
