"""GET/DELETE /v1/models: the base model and the tenant's own adapters; promoting a candidate."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.deps import TenantDep
from gateway.errors import APIError, documented, model_not_found
from gateway.records import change
from openapi.common import DeletedModel, Model, ModelList
from state.versions import split_id, weights
from wire.store import StoreAction

router = APIRouter(prefix="/v1", tags=["models"],
                   responses=documented(404, 409))


def _models(request: Request, tenant_id: str) -> list[Model]:
    state = request.app.state
    base = Model(id=state.settings.model, created=state.started, owned_by="symbiosis")
    adapters = [Model(id=r.id, created=r.created, owned_by=r.tenant, parent=r.base,
                      root=r.base, peft_type=r.peft_type, in_service=bool(r.in_service),
                      version=r.version)
                for r in state.registry.list(tenant_id)]
    return [base, *adapters]


@router.get("/models", response_model=ModelList)
async def list_models(request: Request, tenant: TenantDep) -> ModelList:
    return ModelList(data=_models(request, tenant.id))


@router.get("/models/{model:path}", response_model=Model)
async def retrieve_model(model: str, request: Request, tenant: TenantDep) -> Model:
    for item in _models(request, tenant.id):
        if item.id == model:
            return item
    name, number = split_id(model)
    record = request.app.state.registry.visible(name, tenant.id)
    version = request.app.state.registry.versions.get(name, number) if record and number else None
    if version is None:
        raise model_not_found(model)
    return Model(id=version.id, created=version.created, owned_by=record.tenant,
                 parent=record.base, root=record.base, peft_type=version.peft_type,
                 in_service=version.number in dict(weights(record.serving)),
                 version=version.number)


@router.delete("/models/{model:path}", response_model=DeletedModel)
async def delete_model(model: str, request: Request, tenant: TenantDep) -> DeletedModel:
    state = request.app.state
    if model == state.settings.model:
        raise APIError(403, "The base model cannot be deleted.", "permission_denied", "model")
    if state.registry.visible(model, tenant.id) is None:
        raise model_not_found(model)
    await change(state.manager, StoreAction.DELETE_MODEL, tenant.id, param="model", model=model)
    return DeletedModel(id=model, deleted=True)


@router.post("/fine_tuning/models/{model:path}/promote", response_model=Model)
async def promote_model(model: str, request: Request, tenant: TenantDep) -> Model:
    """Put a candidate (a fine-tuned model that failed a quality gate) in service: its latest
    version, as POST /v1/adapters/{model}/promote does. (Not under /v1/models/{model}: model ids
    hold slashes, so that path would also be a model's.)"""
    if request.app.state.registry.visible(model, tenant.id) is None:
        raise model_not_found(model)
    await change(request.app.state.manager, StoreAction.PROMOTE, tenant.id, model=model)
    return await retrieve_model(model, request, tenant)
