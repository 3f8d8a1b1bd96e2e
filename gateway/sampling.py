"""API request fields -> the worker's sampling parameters (user value, else OpenAI's default).

Every field OpenAI defines is honoured or refused here with a 400 that names it.
"""

from __future__ import annotations

from gateway.errors import APIError, check_metadata, unsupported_parameter
from gateway.tiers import asks_flex
from openapi.chat import ChatCompletionRequest
from openapi.completions import MAX_STOP, CompletionRequest, SamplingFields
from wire.manager import SamplingParams


def stop_list(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP:
        raise APIError(400, f"at most {MAX_STOP} stop sequences are allowed", "invalid_request",
                       "stop")
    return [s for s in stops if s]


MAX_LOGIT_BIAS = 300
UNSUPPORTED = {  # OpenAI fields for features this server does not have: refused when set
    "audio": "this server generates text only",
    "prediction": "predicted outputs are not available here",
    "reasoning_effort": "the models served here are not reasoning models",
    "verbosity": "the models served here have no verbosity levels",
    "web_search_options": "this server has no web search",
    "prompt_cache_key": "this server has no prompt cache to route by",
    "prompt_cache_options": "this server has no prompt cache",
    "prompt_cache_retention": "this server has no prompt cache",
    "moderation": "this server runs no moderation",
    "functions": "use 'tools' (the deprecated 'functions' is not accepted)",
    "function_call": "use 'tool_choice' (the deprecated 'function_call' is not accepted)",
    "suffix": "the models served here cannot fill in the middle",
}
EMPTY_IS_UNSET = {"suffix"}


def refuse_unsupported(request: SamplingFields) -> None:
    for name, reason in UNSUPPORTED.items():
        value = getattr(request, name, None)
        if value or (value is not None and name not in EMPTY_IS_UNSET):
            raise unsupported_parameter(name, reason)
    if getattr(request, "metadata", None) and not getattr(request, "store", None):
        raise unsupported_parameter("metadata", "metadata tags a stored chat completion, and "
                                    "this one is not stored: set store to true")
    check_metadata(getattr(request, "metadata", None))
    if getattr(request, "modalities", None) not in (None, ["text"]):
        raise unsupported_parameter("modalities", "this server generates text only")


def logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's logit_bias: token ids (as strings) -> a bias from -100 to 100."""
    out: dict[int, float] = {}
    if bias and len(bias) > MAX_LOGIT_BIAS:
        raise APIError(400, f"logit_bias may name at most {MAX_LOGIT_BIAS} tokens",
                       "invalid_request", "logit_bias")
    for key, value in (bias or {}).items():
        if not (key.isascii() and key.isdigit()) or len(key) > 10:
            raise APIError(400, f"logit_bias keys must be token ids written as strings, not "
                           f"{key!r}", "invalid_request", "logit_bias")
        if not -100 <= value <= 100:
            raise APIError(400, f"logit_bias values must lie between -100 and 100, not {value} "
                           f"(token {key})", "invalid_request", "logit_bias")
        out[int(key)] = float(value)
    return out


def _common(request: SamplingFields, max_tokens: int | None, logprobs: int | None,
            echo: bool = False) -> SamplingParams:
    refuse_unsupported(request)
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
        logit_bias=logit_bias(request.logit_bias),
        flex=asks_flex(getattr(request, "service_tier", None)),
    )


def constrain(params: SamplingParams, grammar: str | None, param: str) -> None:
    """Make every sequence follow `grammar` (which decides where the output ends)."""
    if grammar is None:
        return
    for name in ("ignore_eos", "min_tokens"):
        if getattr(params, name):
            raise APIError(400, f"'{name}' cannot be combined with '{param}': the constraint "
                           "decides where the output ends", "invalid_request", name)
    params.grammar = grammar


def _capped(max_tokens: int, cap: int, param: str) -> int:
    if cap and max_tokens > cap:
        raise APIError(400, f"'{param}' is {max_tokens}; this server generates at most {cap} "
                       "tokens a request (SYMBIOSIS_MAX_TOKENS_CAP).", "invalid_request", param)
    return max_tokens


def completion_params(request: CompletionRequest, cap: int = 0) -> SamplingParams:
    max_tokens = _capped(16 if request.max_tokens is None else request.max_tokens, cap,
                         "max_tokens")
    if request.min_tokens > max_tokens:
        raise APIError(400, "min_tokens must not exceed max_tokens", "invalid_request",
                       "min_tokens")
    params = _common(request, max_tokens, request.logprobs, request.echo)
    # not asked for: OpenAI's default of 16, at most what fits
    params.fit = request.max_tokens is None or "max_tokens" not in request.model_fields_set
    best_of = request.best_of or request.n
    if best_of < request.n:
        raise APIError(400, f"best_of ({best_of}) must be at least n ({request.n})",
                       "invalid_request", "best_of")
    if best_of > request.n:
        if request.stream:
            raise APIError(400, "best_of cannot be used with stream: the best completions are "
                           "known only when all have finished", "invalid_request", "best_of")
        params.n = best_of
        params.logprobs = request.logprobs or 0  # the chosen tokens' logprobs rank them
    return params


def chat_params(request: ChatCompletionRequest, default_max_tokens: int | None = None,
                cap: int = 0) -> SamplingParams:
    """`default_max_tokens`: for a request without max_tokens (None: until the context is
    full, or `cap`); `cap`: the most a request may ask for (0: none)."""
    param = "max_completion_tokens" if request.max_completion_tokens is not None else \
        "max_tokens"
    _capped(request.min_tokens, cap, "min_tokens")
    max_tokens = request.max_completion_tokens
    if max_tokens is None:
        max_tokens = request.max_tokens
    if max_tokens is None:  # the server's default, but never below the request's min_tokens
        max_tokens = min(default_max_tokens or cap, cap or default_max_tokens or 0)
        max_tokens = max(max_tokens, request.min_tokens) if max_tokens else None  # the context
    elif request.min_tokens > _capped(max_tokens, cap, param):
        raise APIError(400, "min_tokens must not exceed max_completion_tokens",
                       "invalid_request", "min_tokens")
    if request.top_logprobs is not None and not request.logprobs:
        raise APIError(400, "top_logprobs needs logprobs to be true", "invalid_request",
                       "top_logprobs")
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    params = _common(request, max_tokens, logprobs)
    params.fit = request.max_completion_tokens is None and request.max_tokens is None
    return params
