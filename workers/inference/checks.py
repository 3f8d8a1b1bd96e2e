"""What a request must satisfy before it waits for the engine: a 400 with the reason, or None.

Checked against the model (its vocabulary, its context), the worker (its batch) and the
request's own output constraint, which is compiled here once unless it was beforehand (each
sequence copies it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wire import manager as W
from workers.inference.grammar import GrammarError, Grammars

if TYPE_CHECKING:
    from workers.inference.request import Request


def refusal(request: Request, limit: int, vocab_size: int, max_batch: int,
            grammars: Grammars) -> W.Failed | None:
    """None when `request` may wait (its `max_tokens` filled in when unset: as many as fit in
    `limit`; a server's default cut to what fits; its grammar compiled), else why not."""
    params = request.params
    room = max(0, limit - len(request.prompt_ids))
    if params.max_tokens is None:  # as many as fit
        params.max_tokens = room
    elif params.fit:  # a default the client never asked for: no more than fits
        params.max_tokens = max(min(params.max_tokens, room), params.min_tokens)
    if not request.prompt_ids:
        return W.Failed(request.id, 400, "invalid_prompt", "the prompt is empty")
    bad = next((t for t in request.prompt_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        return W.Failed(request.id, 400, "invalid_prompt",
                        f"Token id {bad} is out of range: this model's vocabulary has "
                        f"{vocab_size} tokens (ids 0 to {vocab_size - 1}).")
    bad = next((t for t in params.logit_bias if not 0 <= t < vocab_size), None)
    if bad is not None:
        return W.Failed(request.id, 400, "invalid_logit_bias",
                        f"logit_bias names token {bad}, outside this model's vocabulary "
                        f"of {vocab_size} tokens.")
    if params.grammar is not None and request.grammar is None:  # not compiled beforehand
        try:
            request.grammar = grammars.matcher(params.grammar)
        except GrammarError as exc:
            return grammar_refused(request.id, exc)
    if params.n > max_batch:
        return W.Failed(request.id, 400, "invalid_n",
                        f"{params.n} sequences a prompt (n, or best_of) are more than this "
                        f"server decodes at once ({max_batch})")
    if params.embed and len(request.prompt_ids) > limit:
        return W.Failed(request.id, 400, "context_length_exceeded",
                        f"This model's maximum context length is {limit} tokens. However, an "
                        f"input has {len(request.prompt_ids)} tokens. Please reduce the input.")
    if len(request.prompt_ids) + params.max_tokens > limit:
        return W.Failed(
            request.id, 400, "context_length_exceeded",
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{len(request.prompt_ids) + params.max_tokens} tokens "
            f"({len(request.prompt_ids)} in the prompt, {params.max_tokens} for the "
            "completion). Please reduce the prompt or max_tokens.")
    return None


def grammar_refused(request_id: str, exc: GrammarError) -> W.Failed:
    return W.Failed(request_id, 400, "invalid_response_format",
                    f"The output constraint cannot be used: {exc}")
