"""One generated sequence of a request: the tokens it takes, and when it ends."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from wire import manager as W
from workers.inference.detok import Detokenizer
from workers.inference.merging import Merging
from workers.inference.request import Request
from workers.inference.sampling import Choice, prompt_logprobs

log = logging.getLogger("workers.engine")


@dataclass
class Sequence:
    request: Request
    index: int
    detok: Detokenizer
    generator: torch.Generator | None
    matcher: Any = None  # llguidance matcher of a constrained sequence
    counts: dict[int, int] = field(default_factory=dict)
    generated: int = 0
    last: int = 0
    finish: str | None = None
    merging: Merging | None = None  # a collected request's Deltas go out merged

    def __post_init__(self) -> None:
        if self.request.params.collected:
            self.merging = Merging()

    def allows_eos(self) -> bool:
        params = self.request.params
        return not params.ignore_eos and self.generated >= params.min_tokens

    def accept(self, choice: Choice, eos_ids: tuple[int, ...], tokenizer: Any) -> list[W.Delta]:
        """Take the chosen token: its text (held back while it may start a stop string), and
        whether the sequence ends with it; the Deltas due out (a collected request's merged)."""
        params = self.request.params
        self.last = choice.token
        self.generated += 1
        self.counts[choice.token] = self.counts.get(choice.token, 0) + 1
        is_eos = choice.token in eos_ids and not params.ignore_eos
        text = "" if is_eos else self.detok.add(choice.token)
        logprobs = None if choice.logprob is None else [token_logprob(tokenizer, choice)]
        matcher = self.matcher
        if matcher is not None and not is_eos and not matcher.consume_token(choice.token):
            log.warning("request %s left its grammar: %s", self.request.id, matcher.get_error())
        if is_eos or self.detok.stopped or (matcher is not None and matcher.is_stopped()):
            self.finish = "stop"
        elif self.generated >= params.max_tokens:
            self.finish = "length"
        if self.finish:
            text += self.detok.flush()
        delta = W.Delta(self.request.id, self.index, text, logprobs, self.finish)
        return [delta] if self.merging is None else self.merging.take(delta)


def token_logprob(tokenizer: Any, choice: Choice) -> W.TokenLogprob:
    token = tokenizer.decode([choice.token])
    top = [(tokenizer.decode([t]), lp) for t, lp in (choice.top or [])]
    return W.TokenLogprob(token, choice.logprob, top, list(token.encode("utf-8")))


def started(request: Request, tokenizer: Any = None,
            logits: torch.Tensor | None = None) -> W.Started:
    """A request's first event, once its prompt is in: with the prompt's text where it asks
    for an echo, and its tokens' logprobs from the prompt's `logits` where it asks for those."""
    params, event = request.params, W.Started(request.id, len(request.prompt_ids),
                                               request.fallback, backend=request.backend)
    if params.echo:
        event.prompt_text = tokenizer.decode(request.prompt_ids, skip_special_tokens=True)
    if params.echo and params.logprobs is not None:
        event.prompt_logprobs = [token_logprob(tokenizer, c) for c in prompt_logprobs(
            logits, request.prompt_ids, params.logprobs)]
    return event
