"""GET /health (liveness) and GET /ready (the manager and the executor answer, the disk has
room)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from state.storage import free_bytes

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict:
    return {"status": "ok"}


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    """Ready when the manager and the executor answer and the data directory has room
    (`min_free_mb`): a full disk refuses every upload, registration and job (507)."""
    state = request.app.state
    manager = state.manager
    status = manager.status if manager.up else None
    free = free_bytes(state.settings.data_dir)
    checks = {"manager": status is not None, "executor": bool(status and status.executor_ok),
              "disk": free >= state.settings.min_free_mb * 2**20}
    ok = all(checks.values())
    return JSONResponse({"status": "ready" if ok else "unavailable", "checks": checks,
                         "disk_free_bytes": free}, status_code=200 if ok else 503)
