"""POST /v1/responses/input_tokens: a response request's input counted as the model would read
it. The request is made into its chat request as `/v1/responses` makes it (the same refusals),
and a worker renders and counts it (the chat template, the tools shown, truncation) without
running the model."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from gateway.deps import TenantDep
from gateway.errors import documented, unsupported_parameter
from gateway.generation import admit
from gateway.routes import responses
from gateway.serving import Target
from openapi.input_tokens import InputTokenCount, InputTokensRequest
from openapi.responses import ResponseRequest

router = APIRouter(prefix="/v1", tags=["responses"], responses=documented(400, 404, 429))


@router.post("/responses/input_tokens", response_model=InputTokenCount)
async def count_input_tokens(body: InputTokensRequest, request: Request,
                             tenant: TenantDep) -> InputTokenCount:
    state = request.app.state
    state.serving.resolve(tenant, body.model)  # the model must be the tenant's to ask
    if body.personality is not None:
        raise unsupported_parameter("personality", "the models served here have no "
                                    "personality presets")
    as_response = ResponseRequest.model_construct(**{
        **{name: getattr(body, name) for name in InputTokensRequest.model_fields
           if name != "personality"},
        "input": body.input if body.input is not None else []})
    asked = await run_in_threadpool(responses.asked, state, tenant, as_response)
    params, messages = asked.params, asked.messages
    params.max_tokens, params.count = 0, True
    admit(state, tenant)
    try:  # the base model's tokenizer and template are every adapter's: no adapter is loaded
        run = await state.serving.start(tenant, Target(state.settings.model, None),
                                        request.state.request_id, [{"messages": messages}],
                                        params)
        counted, = await run.collect()
    finally:
        state.tenants.release(tenant)
    return InputTokenCount(input_tokens=counted.started.prompt_tokens)
