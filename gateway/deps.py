"""Request dependencies: the authenticated tenant and the app's services (from app.state)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gateway.errors import APIError
from gateway.tenants import Tenant


def tenant(request: Request) -> Tenant:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise APIError(401, "You didn't provide an API key. Provide it in the Authorization "
                       "header as 'Bearer YOUR_KEY'.", "missing_api_key")
    found = request.app.state.tenants.authenticate(key.strip())
    if found is None:
        raise APIError(401, "Incorrect API key provided.", "invalid_api_key")
    request.state.tenant = found.id
    return found


TenantDep = Annotated[Tenant, Depends(tenant)]
