"""How long to watch shared memory for the other side before sleeping on a doorbell pipe.

Watching costs a core; sleeping costs a wake-up (~10-50 us on a small VM, more under load). Both
ends of the doorbell link watch for a little longer than the other side has usually taken to
answer, when that is short (under `limit_s`), and sleep at once otherwise: a busy or distant peer
gets no watcher, and an idle system has none. Whoever watches yields the core on each look, so
it never keeps a process that has work from running.
"""

from __future__ import annotations


class AdaptiveSpin:
    def __init__(self, limit_s: float = 200e-6) -> None:
        self.limit_s = limit_s
        self.typical_s = limit_s  # moving average of how long the other side took

    def budget(self) -> float:
        """Seconds to watch before sleeping."""
        return 1.5 * self.typical_s if self.typical_s < self.limit_s else 0.0

    def observe(self, seconds: float) -> None:
        self.typical_s += 0.1 * (min(seconds, 10 * self.limit_s) - self.typical_s)
