"""POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway import responses
from gateway.deps import TenantDep
from gateway.errors import APIError, documented
from gateway.generation import Call, generate
from gateway.sampling import chat_params
from gateway.serving import PromptResult
from openapi.chat import ChatCompletionRequest, ChatCompletionResponse
from wire import manager as W

router = APIRouter(prefix="/v1", tags=["chat"],
                   responses=documented(400, 404, 429))


@router.post("/chat/completions", response_model=ChatCompletionResponse)
async def create_chat_completion(body: ChatCompletionRequest, request: Request,
                                 tenant: TenantDep):
    if body.model_extra and "prompt" in body.model_extra:
        raise APIError(400, "'prompt' is not a chat parameter: use 'messages', or "
                       "/v1/completions", "invalid_request", "prompt")
    state = request.app.state
    target = state.serving.resolve(tenant, body.model)
    messages = [W.ChatMessage("system" if m.role == "developer" else m.role, m.text())
                for m in body.messages]
    params = chat_params(body)
    n, want_logprobs = body.n, body.logprobs

    def make_body(call: Call, results: list[PromptResult]) -> dict:
        return responses.chat_response(call.response_id, call.created, body.model, results[0],
                                       n, want_logprobs).model_dump()

    def chunks(call: Call, result: PromptResult, event: W.Message) -> list[dict]:
        base = (call.response_id, call.created, body.model)
        if isinstance(event, W.Started):
            return [responses.chat_chunk(*base, i, role=True, content="") for i in range(n)]
        if not isinstance(event, W.Delta):
            return []
        out = []
        if event.text or event.logprobs:
            out.append(responses.chat_chunk(*base, event.index, content=event.text,
                                            logprobs=event.logprobs if want_logprobs else None))
        if event.finish_reason:
            out.append(responses.chat_chunk(*base, event.index,
                                            finish_reason=event.finish_reason))
        return out

    def usage(call: Call, results: list[PromptResult]) -> dict:
        return responses.usage_chunk(call.response_id, call.created, body.model,
                                     "chat.completion.chunk", results)

    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await generate(request, tenant, target, [{"messages": messages}], params,
                          prefix="chatcmpl", stream=body.stream, include_usage=include_usage,
                          body=make_body, chunks=chunks, usage_chunk=usage)
