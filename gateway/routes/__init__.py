"""HTTP routes, one module per resource, aggregated in `router`."""

from fastapi import APIRouter

from gateway.routes import adapters, chat, completions, health, models

router = APIRouter()
for module in (health, models, completions, chat, adapters):
    router.include_router(module.router)
