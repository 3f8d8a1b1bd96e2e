"""HTTP routes, one module per resource, aggregated in `router`."""

from fastapi import APIRouter

from gateway.routes import (
    adapters,
    batches,
    chat,
    completions,
    conversations,
    dashboard,
    embeddings,
    files,
    fine_tuning,
    health,
    input_tokens,
    models,
    responses,
    stored_chat,
    uploads,
    versions,
)

router = APIRouter()
for module in (health, models, completions, chat, stored_chat, responses, input_tokens,
               embeddings, conversations, adapters, versions, files, uploads, batches, fine_tuning,
               dashboard):
    router.include_router(module.router)
