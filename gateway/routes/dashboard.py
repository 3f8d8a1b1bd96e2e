"""GET /dashboard: a page for tenants and operators, and the two JSON views it reads.

The page (static HTML and script, no build step) signs in with an API key kept in the browser's
session storage, or with the one-time link `symbiosis serve` prints (a session cookie,
`gateway.sessions`), and reads the public API (/v1/models, /v1/fine_tuning/jobs, their events and
checkpoints) plus `/dashboard/api/usage` (the tenant's own request figures), `/dashboard/api/kept`
(what it keeps, by kind, its conversations and stored responses) and, with an operator key,
`/dashboard/api/operator` (the executor's batching, the workers, the job queue).
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, Field

from gateway.deps import TenantDep, operator
from gateway.errors import APIError
from gateway.sessions import COOKIE, SESSION_S
from gateway.tiers import FLEX
from state.usage import stored_by_kind, stored_bytes
from wire.figures import ExecutorFigures

router = APIRouter(include_in_schema=False)
LISTED = 100  # the newest conversations and stored responses shown


@router.get("/dashboard")
async def page() -> HTMLResponse:
    html = resources.files("gateway").joinpath("static/dashboard.html").read_text("utf-8")
    return HTMLResponse(html, headers={"cache-control": "no-cache"})


class SignIn(BaseModel):
    link: str = Field(max_length=200)


@router.post("/dashboard/api/signin")
async def sign_in(body: SignIn, request: Request) -> JSONResponse:
    """The one-time link's token (from the URL fragment) for a session cookie."""
    session = request.app.state.sessions.exchange(body.link)
    if session is None:
        raise APIError(401, "This sign-in link was used already or has expired: sign in with "
                       "an API key.", "invalid_sign_in_link")
    response = JSONResponse({"signed_in": True})
    response.set_cookie(COOKIE, session, max_age=SESSION_S, path="/", httponly=True,
                        samesite="strict")
    return response


@router.post("/dashboard/api/signout")
async def sign_out(request: Request) -> JSONResponse:
    request.app.state.sessions.end(request.cookies.get(COOKIE))
    response = JSONResponse({"signed_in": False})
    response.delete_cookie(COOKIE, path="/")
    return response


@router.get("/dashboard/api/usage")
async def usage(request: Request, tenant: TenantDep) -> dict:
    """This tenant's requests by route and status, tokens, the mean time to its first token and
    between its tokens (as the gateway received them; of its requests at the default tier, not
    the flex ones, which wait behind them), the share of those that met the tenant's own targets
    (None: no target set, or nothing timed yet), what it keeps against its storage quota (None:
    no quota), and its rate limits as its keys' responses report them."""
    state = request.app.state
    metrics = state.metrics
    requests, tokens, timed = [], {}, {}
    targets: dict[str, list[int]] = {}  # target -> [missed, met]
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.labels.get("tenant") != tenant.id:
                continue
            if sample.name == "symbiosis_requests_total":
                requests.append({"route": sample.labels["route"],
                                 "status": sample.labels["status"], "count": int(sample.value)})
            elif sample.name == "symbiosis_tokens_total":
                kind = sample.labels["kind"]
                tokens[kind] = tokens.get(kind, 0) + int(sample.value)
            elif sample.name.endswith(("_seconds_sum", "_seconds_count")) and \
                    sample.labels.get("tier") != FLEX:
                timed[sample.name] = sample.value
            elif sample.name == "symbiosis_token_targets_total":
                counted = targets.setdefault(sample.labels["target"], [0, 0])
                counted[sample.labels["met"] == "true"] += int(sample.value)

    def mean(histogram: str) -> float | None:
        count = timed.get(f"{histogram}_count", 0)
        return timed[f"{histogram}_sum"] / count if count else None

    def met(target: str) -> float | None:
        missed, hit = targets.get(target, (0, 0))
        return hit / (hit + missed) if hit + missed else None

    return {"tenant": tenant.id, "requests": requests, "tokens": tokens,
            "mean_time_to_first_token_s": mean("symbiosis_time_to_first_token_seconds"),
            "mean_inter_token_s": mean("symbiosis_inter_token_seconds"),
            "time_to_first_token_target_met": met("time_to_first_token"),
            "inter_token_target_met": met("inter_token"),
            "storage": {"used_bytes": await run_in_threadpool(stored_bytes, state.db, tenant.id),
                "quota_bytes": tenant.storage_quota() or None},
            "rate_limits": state.rate_limits.report(tenant)}


@router.get("/dashboard/api/kept")
async def kept(request: Request, tenant: TenantDep) -> dict:
    """What this tenant keeps, in bytes by kind (as its storage quota counts them), and its
    newest conversations and stored responses with their sizes (OpenAI's API lists neither:
    here are their ids, to read or delete them by)."""
    state = request.app.state

    def read() -> dict:
        return {"bytes": stored_by_kind(state.db, tenant.id),
                "conversations": state.conversations.listed(tenant.id, LISTED),
                "responses": state.responses.listed(tenant.id, LISTED)}
    return await run_in_threadpool(read)


@router.get("/dashboard/api/operator")
async def operator_view(request: Request) -> dict:
    state = request.app.state
    operator(request, "The operator view")
    status = await state.manager.fresh_status() if state.manager.up else None
    workers = [{"tenant": w.tenant, "models": w.models, "state": w.state, "pid": w.pid,
                "inflight": w.inflight, "idle_s": round(w.idle_s, 1), "pinned": w.pinned}
               for w in (status.workers if status else [])]
    twin = status.training_executor_ok if status else None  # None: no idle twin
    return {"executor_up": bool(status and status.executor_ok),
            "executor": executor_figures(status.executor if status else None),
            "training_executor_up": twin,
            "training_executor": None if twin is None
            else executor_figures(status.training_executor),
            "workers": workers, "manager": dict(status.counters) if status else {},
            "jobs": state.jobs.count_by_status()}


def executor_figures(figures: ExecutorFigures | None) -> dict:
    """The executor's figures -> batching per call kind and per lane."""
    if figures is None:
        return {"queue_depth": 0, "clients": 0, "mixed_batches": 0, "kinds": {}, "lanes": {},
                "training_slice_ms": None, "training_share": None, "training_share_floor": None,
                "twin_hold_ms": None, "twin_owed_batches": 0}

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 3) if b else None

    return {
        "queue_depth": figures.queue_depth, "clients": figures.clients,
        "mixed_batches": figures.mixed_batches,
        "kinds": {kind: {"calls": k.calls, "batches": k.batches, "rows": k.rows,
                         "wait_ms_sum": k.wait_ms.sum, "waits": k.wait_ms.count,
                         "calls_per_batch": ratio(k.batch_calls.sum, k.batch_calls.count),
                         "mean_wait_ms": ratio(k.wait_ms.sum, k.wait_ms.count)}
                  for kind, k in sorted(figures.kinds.items())},
        "lanes": {lane: {"calls": g.calls, "mean_wait_ms": ratio(1e3 * g.wait_s, g.calls),
                         "target_ms": g.target_ms,
                         "met_percent": None if g.target_ms is None
                         else ratio(100 * g.met, g.calls)}
                  for lane, g in sorted(figures.lanes.items())},
        "training_slice_ms": figures.training_slice_ms,
        "training_share": figures.training_share,
        "training_share_floor": figures.training_share_floor,
        "twin_hold_ms": figures.twin_hold_ms,  # None: no idle twin
        "twin_owed_batches": figures.twin_owed_batches,
    }
