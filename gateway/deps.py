"""Request dependencies: the authenticated tenant and the app's services (from app.state)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gateway.errors import APIError
from gateway.guard import authenticate
from gateway.tenants import OPERATOR, Tenant


def tenant(request: Request) -> Tenant:
    found = authenticate(request.headers.get("authorization", ""),
                         request.app.state.tenants)
    if found.id == OPERATOR:
        raise APIError(403, "An operator key reads /metrics; it is no tenant's key.",
                       "operator_key")
    request.state.tenant = found.id
    return found


TenantDep = Annotated[Tenant, Depends(tenant)]


def operator(request: Request, why: str) -> Tenant:
    """The caller, if its key is an operator's (an admin tenant or SYMBIOSIS_ADMIN_KEYS)."""
    found = authenticate(request.headers.get("authorization", ""), request.app.state.tenants)
    if not found.admin:
        raise APIError(403, f"{why} needs an operator key (an admin tenant or "
                       "SYMBIOSIS_ADMIN_KEYS).", "admin_key_required")
    return found
