"""POST /v1/adapters: register a PEFT adapter (multipart upload of its two files)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, File, Form, Request, UploadFile

from gateway.deps import TenantDep
from gateway.errors import APIError, documented
from openapi.common import Model
from state.adapters import AdapterError

router = APIRouter(prefix="/v1", tags=["adapters"],
                   responses=documented(400))


@router.post("/adapters", response_model=Model, status_code=201)
async def register_adapter(request: Request, tenant: TenantDep,
                           name: Annotated[str, Form(min_length=1, max_length=64)],
                           adapter_config: Annotated[UploadFile, File()],
                           adapter_model: Annotated[UploadFile, File()],
                           promote: Annotated[bool, Form()] = True) -> Model:
    """Register an adapter: a new model, or the next immutable version of the tenant's model of
    that name, which serves the name at once unless `promote` is false (then see
    /v1/adapters/{model}/promote and /split)."""
    state = request.app.state
    limit = state.settings.max_upload_bytes
    with tempfile.TemporaryDirectory(dir=state.settings.data_dir) as tmp:
        for upload, filename in ((adapter_config, "adapter_config.json"),
                                 (adapter_model, "adapter_model.safetensors")):
            data = await upload.read(limit + 1)
            if len(data) > limit:
                raise APIError(413, f"{filename} is larger than {limit} bytes", "file_too_large")
            (Path(tmp) / filename).write_bytes(data)
        try:
            version = state.registry.register(tenant.id, name, Path(tmp), in_service=promote)
        except AdapterError as exc:
            raise APIError(400, str(exc), "invalid_adapter") from None
    return Model(id=version.model, created=version.created, owned_by=tenant.id,
                 parent=state.registry.base, root=state.registry.base,
                 peft_type=version.peft_type, in_service=promote, version=version.number)
