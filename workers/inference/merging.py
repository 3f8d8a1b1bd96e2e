"""A collected request's tokens (its client gets the answer whole, not streamed) leave the worker
merged: one `Delta` of several tokens instead of one a token, so that the manager and the
gateway handle a message every `FLUSH_S` rather than one a token. A sequence's first token still
leaves at once (its time to first token is timed as it comes), and its last with the rest, so
the gateway's wait for the next event never grows past `FLUSH_S` plus a token's time."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from wire import manager as W

FLUSH_S = 0.5


@dataclass
class Merging:
    """One collected sequence's Deltas: each taken, and those due out returned."""

    clock: Callable[[], float] = time.monotonic
    pending: W.Delta | None = None
    sent_at: float | None = None

    def take(self, delta: W.Delta) -> list[W.Delta]:
        if self.pending is not None:
            delta, self.pending = merged(self.pending, delta), None
        now = self.clock()
        if self.sent_at is None or delta.finish_reason or now - self.sent_at >= FLUSH_S:
            self.sent_at = now
            return [delta]
        self.pending = delta
        return []


def merged(first: W.Delta, then: W.Delta) -> W.Delta:
    """One sequence's two Deltas as one: their text, logprobs and tokens, the later's end."""
    logprobs = None if first.logprobs is None and then.logprobs is None else [
        *(first.logprobs or []), *(then.logprobs or [])]
    return W.Delta(first.id, first.index, first.text + then.text, logprobs, then.finish_reason,
                   first.tokens + then.tokens)
