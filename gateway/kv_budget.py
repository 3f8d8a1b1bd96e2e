"""A tenant's budget of KV-cache tokens across its in-flight requests (`max_kv_tokens`).

A request holds, until it ends, about (prompt tokens + max_tokens) x n of the cache: every one
of its n sequences keeps its own keys and values. Prompt tokens are counted with the base
model's tokenizer; a chat prompt adds ChatML's few tokens per message. A request larger than
the whole budget is a 400; one that does not fit beside the tenant's others is a 429.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from gateway.errors import RETRY_SOON, APIError
from gateway.tenants import Tenant, TenantDirectory
from gateway.tokens import TextTokens
from wire import manager as W

CHAT_MESSAGE_TOKENS = 4  # <|im_start|>, the role, "\n" ... <|im_end|>, "\n"
CHAT_PROMPT_TOKENS = 3  # <|im_start|>assistant\n
DEFAULT_CONTEXT = 2048


def kv_tokens(tokens: TextTokens, prompts: list[dict], params: W.SamplingParams,
              max_context: int) -> int:
    total = 0
    for prompt in prompts:
        if "prompt_ids" in prompt:
            length = len(prompt["prompt_ids"])
        elif "messages" in prompt:
            length = CHAT_PROMPT_TOKENS + sum(tokens.count(m.content) + CHAT_MESSAGE_TOKENS
                                              for m in prompt["messages"])
        else:
            length = max(1, tokens.count(prompt["prompt"]))
        if params.truncate:  # its earliest messages go where it would not fit
            length = min(length, max(1, max_context - (params.max_tokens or 1)))
        output = params.max_tokens if params.max_tokens is not None else \
            max(0, max_context - length)
        total += (length + output) * params.n
    return total


async def reserve(directory: TenantDirectory, tokens: TextTokens, tenant: Tenant,
                  prompts: list[dict], params: W.SamplingParams) -> int:
    """Hold this request's share of the tenant's budget (what to give back when it ends). Its
    text is counted by a worker thread: a 2 MB prompt takes the tokenizer over a second, which
    the event loop spends on everyone else's requests meanwhile."""
    if not tenant.max_kv_tokens:
        return 0
    context = tenant.max_context or tokens.max_context or DEFAULT_CONTEXT
    if all("prompt_ids" in prompt for prompt in prompts):
        need = kv_tokens(tokens, prompts, params, context)
    else:
        need = await run_in_threadpool(kv_tokens, tokens, prompts, params, context)
    if need > tenant.max_kv_tokens:
        raise APIError(400, f"This request needs about {need} KV-cache tokens ((prompt + "
                       f"max_tokens) x n), more than tenant {tenant.id}'s whole budget of "
                       f"{tenant.max_kv_tokens}; lower max_tokens or n.", "kv_budget_exceeded")
    held = directory.reserve_kv(tenant, need)
    if held is None:
        raise APIError(429, f"Tenant {tenant.id}'s requests in flight hold most of its "
                       f"{tenant.max_kv_tokens} KV-cache tokens and this one needs about "
                       f"{need}; retry when one finishes.", "rate_limit_exceeded",
                       headers=RETRY_SOON)
    return held
