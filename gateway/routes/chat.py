"""POST /v1/chat/completions (one asked to be stored is kept: `gateway.stored_chat`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from gateway import obfuscation, responses, stored_chat
from gateway.chat_stream import ChatStream
from gateway.deps import TenantDep
from gateway.errors import APIError, documented
from gateway.generation import Call, generate
from gateway.history import check_history
from gateway.sampling import chat_params, constrain
from gateway.serving import PromptResult
from gateway.settings import GatewaySettings
from gateway.structured import response_format_grammar
from gateway.tools import ToolMode, tool_mode, worker_messages
from openapi.chat import ChatCompletionRequest, ChatCompletionResponse
from wire import manager as W

router = APIRouter(prefix="/v1", tags=["chat"],
                   responses=documented(400, 404, 429))


@router.post("/chat/completions", response_model=ChatCompletionResponse)
async def create_chat_completion(body: ChatCompletionRequest, request: Request,
                                 tenant: TenantDep):
    state = request.app.state
    target = state.serving.resolve(tenant, body.model, body.user or body.safety_identifier)
    check_history(body.messages)
    params, tools, messages = await prepared_off_loop(body, state.settings)
    n, want_logprobs = body.n, body.logprobs
    streams: dict[str, ChatStream] = {}

    def make_body(call: Call, results: list[PromptResult]) -> dict:
        return responses.chat_response(call.response_id, call.created, body.model, results[0],
                                       n, want_logprobs, tools).model_dump()

    def chunks(call: Call, result: PromptResult, event: W.Message) -> list[dict]:
        stream = streams.setdefault(call.response_id, ChatStream(
            (call.response_id, call.created, body.model), n, tools, want_logprobs))
        return stream.chunks(event)

    def usage(call: Call, results: list[PromptResult]) -> dict:
        return responses.usage_chunk(call.response_id, call.created, body.model,
                                     "chat.completion.chunk", results)

    async def kept(made: dict) -> None:
        stored = await stored_chat.keep(state.manager, tenant, made, body)
        state.metrics.stored_chats.labels(tenant.id, str(stored).lower()).inc()

    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await generate(request, tenant, target, [{"messages": messages}], params,
                          prefix="chatcmpl-", stream=body.stream, include_usage=include_usage,
                          body=make_body, chunks=chunks, usage_chunk=usage,
                          user=body.user or body.safety_identifier,
                          obfuscate=obfuscation.wanted(body.stream_options),
                          kept=kept if body.store else None)


async def prepared_off_loop(body: ChatCompletionRequest, settings: GatewaySettings) -> \
        tuple[W.SamplingParams, ToolMode, list[W.ChatMessage]]:
    """`prepared`, by a worker thread where it may compile a grammar (llguidance took a third
    of a second over a 600 KB schema, which the event loop spends on other requests)."""
    if body.response_format is None and not body.tools:
        return prepared(body, settings)
    return await run_in_threadpool(prepared, body, settings)


def prepared(body: ChatCompletionRequest, settings: GatewaySettings) -> \
        tuple[W.SamplingParams, ToolMode, list[W.ChatMessage]]:
    """The worker's sampling parameters (constrained by a forced call or a response format),
    the tool mode and the messages, the tools shown in the system message."""
    params = chat_params(body, settings.chat_default_max_tokens(), settings.max_tokens_cap)
    tools = tool_mode(body)
    json_format = response_format_grammar(body.response_format)
    if json_format and tools.grammar:
        raise APIError(400, "response_format cannot be combined with a tool_choice that "
                       "forces a call", "invalid_request", "response_format")
    constrain(params, tools.grammar or json_format,
              "tool_choice" if tools.grammar else "response_format")
    return params, tools, worker_messages(body)
