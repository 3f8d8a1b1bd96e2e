"""API request fields -> the worker's sampling parameters (user value, else OpenAI's default)."""

from __future__ import annotations

from gateway.errors import APIError
from openapi.chat import ChatCompletionRequest
from openapi.completions import MAX_STOP, CompletionRequest, SamplingFields
from wire.manager import SamplingParams

UNTIL_CONTEXT = -1  # chat without max tokens: as many as fit in the context


def stop_list(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP:
        raise APIError(400, f"at most {MAX_STOP} stop sequences are allowed", "invalid_request",
                       "stop")
    return [s for s in stops if s]


def _common(request: SamplingFields, max_tokens: int, logprobs: int | None,
            echo: bool = False) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=max(0, request.top_k or 0),
        n=request.n,
        seed=request.seed,
        stop=stop_list(request.stop),
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        logprobs=logprobs,
        echo=echo,
        ignore_eos=request.ignore_eos,
        min_tokens=request.min_tokens,
    )


def completion_params(request: CompletionRequest) -> SamplingParams:
    max_tokens = 16 if request.max_tokens is None else request.max_tokens
    if request.min_tokens > max_tokens:
        raise APIError(400, "min_tokens must not exceed max_tokens", "invalid_request",
                       "min_tokens")
    return _common(request, max_tokens, request.logprobs, request.echo)


def chat_params(request: ChatCompletionRequest) -> SamplingParams:
    max_tokens = request.max_completion_tokens
    if max_tokens is None:
        max_tokens = request.max_tokens
    if max_tokens is None:
        max_tokens = UNTIL_CONTEXT
    elif request.min_tokens > max_tokens:
        raise APIError(400, "min_tokens must not exceed max_completion_tokens",
                       "invalid_request", "min_tokens")
    if request.top_logprobs is not None and not request.logprobs:
        raise APIError(400, "top_logprobs needs logprobs to be true", "invalid_request",
                       "top_logprobs")
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    return _common(request, max_tokens, logprobs)
