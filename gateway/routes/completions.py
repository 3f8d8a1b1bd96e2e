"""POST /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from gateway import obfuscation, responses
from gateway.deps import TenantDep
from gateway.errors import documented
from gateway.generation import Call, generate
from gateway.prompts import prompt_specs
from gateway.sampling import completion_params, constrain
from gateway.serving import PromptResult
from gateway.structured import response_format_grammar
from openapi.completions import CompletionRequest, CompletionResponse
from wire import manager as W

router = APIRouter(prefix="/v1", tags=["completions"],
                   responses=documented(400, 404, 429))


@router.post("/completions", response_model=CompletionResponse)
async def create_completion(body: CompletionRequest, request: Request, tenant: TenantDep):
    state = request.app.state
    target = state.serving.resolve(tenant, body.model, body.user or body.safety_identifier)
    prompts = prompt_specs(body.prompt, state.text_tokens.vocab_size)
    params = completion_params(body, state.settings.max_tokens_cap)
    if body.response_format is not None:  # its grammar compiled by a worker thread
        constrain(params, await run_in_threadpool(response_format_grammar, body.response_format),
                  "response_format")
    n, want_logprobs, echo = body.n, body.logprobs is not None, body.echo

    def make_body(call: Call, results: list[PromptResult]) -> dict:
        if params.n > n:  # best_of
            results = [responses.best_of(r, n, params.n) for r in results]
        return responses.completion_response(call.response_id, call.created, body.model,
                                             results, n, want_logprobs, echo).model_dump()

    written: dict[tuple[int, int], int] = {}  # a choice's tokens' characters sent so far

    def chunks(call: Call, result: PromptResult, event: W.Message) -> list[dict]:
        """Offsets count the tokens' characters, as the response made at once does (a stop
        sequence cut from the text leaves its tokens' logprobs)."""
        if isinstance(event, W.Started):
            if not echo:
                return []
            prompt_logprobs = list(event.prompt_logprobs or []) if want_logprobs else None
            for i in range(n):
                written[(result.index, i)] = sum(len(t.token) for t in prompt_logprobs or [])
            return [responses.completion_chunk(
                call.response_id, call.created, body.model, result,
                W.Delta(event.id, i, event.prompt_text, prompt_logprobs), n) for i in range(n)]
        if isinstance(event, W.Delta):
            before = written.get((result.index, event.index), 0)
            written[(result.index, event.index)] = before + sum(
                len(t.token) for t in event.logprobs or [])
            return [responses.completion_chunk(call.response_id, call.created, body.model,
                                               result, event, n, before)]
        return []

    def usage(call: Call, results: list[PromptResult]) -> dict:
        return responses.usage_chunk(call.response_id, call.created, body.model,
                                     "text_completion", results)

    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await generate(request, tenant, target, prompts, params, prefix="cmpl-",
                          stream=body.stream, include_usage=include_usage, body=make_body,
                          chunks=chunks, usage_chunk=usage,
                          user=body.user or body.safety_identifier,
                          obfuscate=obfuscation.wanted(body.stream_options))
