"""Request dependencies: the authenticated tenant and the app's services (from app.state)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gateway.errors import APIError
from gateway.guard import IN_PROCESS_TENANT, authenticate
from gateway.rate_limits import count_request
from gateway.sessions import COOKIE
from gateway.tenants import OPERATOR, Tenant


def caller(request: Request) -> Tenant:
    """Who asks: the bearer key's tenant, or for a GET without one, the dashboard session's
    (`gateway.sessions`), or for a request the gateway makes of itself (a batch's line, a
    background response) the tenant it names (`gateway.in_process`; no client can set a
    scope's keys); else the OpenAI-shaped 401."""
    if (inner := request.scope.get(IN_PROCESS_TENANT)) is not None:
        found = request.app.state.tenants.get(inner)
        if found is None:
            raise APIError(401, f"Tenant {inner} was revoked.", "invalid_api_key")
        return found
    header = request.headers.get("authorization", "")
    if not header and request.method == "GET":
        session = request.app.state.sessions.tenant(request.cookies.get(COOKIE))
        found = request.app.state.tenants.get(session) if session else None
        if found is not None:
            return found
    return authenticate(header, request.app.state.tenants)


def tenant(request: Request) -> Tenant:
    """The caller, a tenant, with one of its requests per minute taken where a key asks (not
    for the dashboard's reads in a signed-in browser, nor a request the gateway makes of itself,
    whose client's request was counted); the response reports its limits (`x-ratelimit-*`, the
    `request_context` middleware)."""
    found = caller(request)
    if found.id == OPERATOR:
        raise APIError(403, "An operator key reads /metrics; it is no tenant's key.",
                       "operator_key")
    request.state.tenant = found.id
    if request.scope.get(IN_PROCESS_TENANT) is None and "authorization" in request.headers:
        request.state.rate_limited = found
        count_request(request.app.state, request.scope, found)
    return found


TenantDep = Annotated[Tenant, Depends(tenant)]


def operator(request: Request, why: str) -> Tenant:
    """The caller, if its key is an operator's (an admin tenant or SYMBIOSIS_ADMIN_KEYS)."""
    found = caller(request)
    if not found.admin:
        raise APIError(403, f"{why} needs an operator key (an admin tenant or "
                       "SYMBIOSIS_ADMIN_KEYS).", "admin_key_required")
    return found


async def known_form_fields(request: Request) -> None:
    """Refuse a form field the route does not take (as a JSON body's unknown field is),
    naming it: the route's form and file parameters are the fields it takes."""
    known = {field.alias for field in request.scope["route"].dependant.body_params}
    unknown = sorted(set((await request.form()).keys()) - known)
    if unknown:
        raise APIError(400, f"Unrecognized request argument supplied: {unknown[0]}",
                       "invalid_request", unknown[0])


KnownFormFields = Depends(known_form_fields)
