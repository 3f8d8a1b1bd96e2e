"""A collected request's tokens (its client gets the answer whole, not streamed) leave the worker
merged: one `Delta` of several tokens instead of one a token, so that the manager and the
gateway handle a message every `FLUSH_S` rather than one a token. A sequence's first token still
leaves at once (its time to first token is timed as it comes), and its last with the rest, so
the gateway's wait for the next event never grows past `FLUSH_S` plus a token's time."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from wire import manager as W

FLUSH_S = 0.5


@dataclass
class Merging:
    """One collected sequence's Deltas: each taken, and those due out returned (those held
    since the last sent, as one)."""

    clock: Callable[[], float] = time.monotonic
    held: list[W.Delta] = field(default_factory=list)
    sent_at: float | None = None

    def take(self, delta: W.Delta) -> list[W.Delta]:
        self.held.append(delta)
        now = self.clock()
        if self.sent_at is None or delta.finish_reason or now - self.sent_at >= FLUSH_S:
            self.sent_at = now
            due, self.held = merged(self.held), []
            return [due]
        return []


def merged(deltas: list[W.Delta]) -> W.Delta:
    """One sequence's Deltas as one: their text, logprobs and tokens, the last one's end."""
    if len(deltas) == 1:
        return deltas[0]
    first = deltas[0]
    logprobs = None if all(d.logprobs is None for d in deltas) else [
        t for d in deltas for t in d.logprobs or []]
    return W.Delta(first.id, first.index, "".join(d.text for d in deltas), logprobs,
                   deltas[-1].finish_reason, sum(d.tokens for d in deltas))
