"""create_app(settings): the FastAPI app; its services live on app.state, built in lifespan."""

from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response

from gateway import errors
from gateway.background import BackgroundRunner
from gateway.batch_runner import BatchRunner
from gateway.deps import operator
from gateway.guard import BodyGuard
from gateway.head import HeadAsGet
from gateway.manager_client import ManagerClient
from gateway.metrics import Metrics
from gateway.rate_limits import RateLimits
from gateway.request_context import RequestContext
from gateway.routes import router
from gateway.schema_bounds import closed_forms, exact_bounds, upload_limit
from gateway.serving import Serving
from gateway.sessions import Sessions
from gateway.settings import GatewaySettings
from gateway.slots import TenantSlots
from gateway.tenants import TenantDirectory
from gateway.tokens import TextTokens
from gateway.turns import Turns
from state.adapters import AdapterReader
from state.batches import BatchReader
from state.chat_completions import ChatReader
from state.conversations import ConversationReader
from state.db import Database
from state.files import FileReader
from state.jobs import JobReader
from state.responses import ResponseReader
from state.storage import Reserve
from state.uploads import UploadReader

log = logging.getLogger("gateway")


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    settings = settings or GatewaySettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        if not Reserve(settings.data_dir).restore():
            log.warning("no room for the 1 MiB space reserve in %s", settings.data_dir)
        state = app.state
        state.settings = settings
        state.started = int(time.time())
        state.db = Database(settings.db_path, read_only=True)  # the worker manager writes
        state.registry = AdapterReader(state.db, settings.data_dir, settings.model)
        state.files = FileReader(state.db, settings.data_dir)
        state.upload_records = UploadReader(state.db, settings.data_dir)
        state.responses = ResponseReader(state.db)
        state.chats = ChatReader(state.db)
        state.conversations = ConversationReader(state.db)
        state.turns = Turns()
        state.batches = BatchReader(state.db)
        state.uploads = TenantSlots(settings.max_concurrent_uploads, "uploads")
        state.sessions = Sessions(settings.dashboard_link)
        state.jobs = JobReader(state.db)
        state.text_tokens = TextTokens(settings.model)
        state.tenants = TenantDirectory.load(settings.tenants_path, settings.api_keys,
                                             max_concurrent=settings.max_concurrent,
                                             max_kv_tokens=settings.max_kv_tokens,
                                             max_storage_mb=settings.max_storage_mb,
                                             max_context=settings.max_context,
                                             requests_per_minute=settings.requests_per_minute,
                                             tokens_per_minute=settings.tokens_per_minute,
                                             admin_keys=settings.admin_keys)
        state.manager = ManagerClient(settings.manager, stale_s=settings.manager_stale_s)
        await state.manager.start()
        state.serving = Serving(state.manager, state.registry, settings.model,
                                settings.first_token_timeout_s, settings.next_token_timeout_s)
        state.batch_runner = BatchRunner(app)
        state.batch_runner.start()
        state.background = BackgroundRunner(app)
        state.background.start()
        log.info("gateway ready: model=%s tenants=%d data_dir=%s", settings.model,
                 len(state.tenants.tenants), settings.data_dir)
        try:
            yield
        finally:
            await state.batch_runner.stop()
            await state.background.stop()
            await state.manager.close()
            state.db.close()

    app = FastAPI(title="Symbiosis", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible completions and fine-tuning for many tenants' "
                              "PEFT adapters on one shared base model.")
    app.state.metrics = Metrics()
    app.state.rate_limits = RateLimits()
    errors.install(app)
    app.include_router(router)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        state = request.app.state
        if not state.settings.public_metrics:
            operator(request, "/metrics lists every tenant's volumes, so it")
        status = state.manager.status if state.manager.up else None
        return Response(state.metrics.render(status, state.jobs.count_by_status()),
                        media_type="text/plain; version=0.0.4")

    app.add_middleware(RequestContext, state=app.state)
    app.add_middleware(HeadAsGet)
    app.add_middleware(BodyGuard, settings=settings)  # outermost: before any body is read
    default_openapi = app.openapi
    app.openapi = lambda: upload_limit(closed_forms(exact_bounds(default_openapi())),
                                       settings.max_upload_bytes)  # (cached, patched once)
    return app

