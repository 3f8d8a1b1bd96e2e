"""A tenant's budget of KV-cache tokens across its in-flight requests (`max_kv_tokens`).

A request holds, until it ends, about (prompt tokens + max_tokens) x n of the cache: every one
of its n sequences keeps its own keys and values. Prompt tokens are counted with the base
model's tokenizer; a chat prompt adds ChatML's few tokens per message. A request larger than the
whole budget is a 400; one that does not fit beside the tenant's others is a 429 (flex requests
hold at most three quarters of it together: `gateway.tiers`). The same counts are what a
request's prompt takes of its tenant's tokens per minute (`rate_limits`).
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


def prompt_lengths(tokens: TextTokens, prompts: list[dict], params: W.SamplingParams,
                   max_context: int) -> list[int]:
    """Each prompt's tokens, as far as a request's limits count them (a truncated one's as it
    will be cut)."""
    lengths = []
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
        lengths.append(length)
    return lengths


def kv_need(lengths: list[int], params: W.SamplingParams, max_context: int) -> int:
    total = 0
    for length in lengths:
        output = params.max_tokens if params.max_tokens is not None else \
            max(0, max_context - length)
        total += (length + output) * params.n
    return total


def kv_tokens(tokens: TextTokens, prompts: list[dict], params: W.SamplingParams,
              max_context: int) -> int:
    return kv_need(prompt_lengths(tokens, prompts, params, max_context), params, max_context)


def context(tokens: TextTokens, tenant: Tenant) -> int:
    return tenant.max_context or tokens.max_context or DEFAULT_CONTEXT


async def counted(tokens: TextTokens, tenant: Tenant, prompts: list[dict],
                  params: W.SamplingParams) -> list[int]:
    """The prompts' lengths where the tenant's limits need them (the KV budget, the tokens per
    minute), else none. Text is counted by a worker thread: a 2 MB prompt takes the tokenizer
    over a second, which the event loop spends on everyone else's requests meanwhile."""
    if not (tenant.max_kv_tokens or tenant.tokens_per_minute):
        return []
    if all("prompt_ids" in prompt for prompt in prompts):
        return prompt_lengths(tokens, prompts, params, context(tokens, tenant))
    return await run_in_threadpool(prompt_lengths, tokens, prompts, params,
                                   context(tokens, tenant))


def reserve(directory: TenantDirectory, tokens: TextTokens, tenant: Tenant, lengths: list[int],
            params: W.SamplingParams) -> int:
    """Hold this request's share of the tenant's budget (what to give back when it ends)."""
    if not tenant.max_kv_tokens:
        return 0
    need = kv_need(lengths, params, context(tokens, tenant))
    if need > tenant.max_kv_tokens:
        raise APIError(400, f"This request needs about {need} KV-cache tokens ((prompt + "
                       f"max_tokens) x n), more than tenant {tenant.id}'s whole budget of "
                       f"{tenant.max_kv_tokens}; lower max_tokens or n.", "kv_budget_exceeded")
    held = directory.reserve_kv(tenant, need, params.flex)
    if held is None:
        flex = " (its flex requests at most three quarters of them)" if params.flex else ""
        raise APIError(429, f"Tenant {tenant.id}'s requests in flight hold most of its "
                       f"{tenant.max_kv_tokens} KV-cache tokens{flex} and this one needs about "
                       f"{need}; retry when one finishes.", "rate_limit_exceeded",
                       headers=RETRY_SOON)
    return held
