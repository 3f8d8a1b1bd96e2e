"""GET /health (liveness) and GET /ready (the manager and the executor answer)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict:
    return {"status": "ok"}


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    manager = request.app.state.manager
    status = manager.status if manager.up else None
    checks = {"manager": status is not None, "executor": bool(status and status.executor_ok)}
    ok = all(checks.values())
    return JSONResponse({"status": "ready" if ok else "unavailable", "checks": checks},
                        status_code=200 if ok else 503)
