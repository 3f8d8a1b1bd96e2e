"""How many threads a trainer's step runs its own compute on (attention, backward, optimizer):
its share of the cores (the worker manager's, `workers.manager.capacity.ThreadShare`), but no
more than the step's tokens keep busy. Under OpenMP's PASSIVE wait policy each op that runs on
a second thread wakes it, which a small step does not repay: one job alone on a 2-core Xeon,
one thread against two (bench/NOTES.md), 1 x 64-token steps -5 %, 1 x 128 equal, 2 x 128
+7 %."""

from __future__ import annotations

TOKENS_PER_THREAD = 128


def step_threads(share: int, tokens: int) -> int:
    """Threads for a step of `tokens` (at most a micro-batch's) out of `share`."""
    return max(1, min(share, tokens // TOKENS_PER_THREAD))
