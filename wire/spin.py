"""How long to watch shared memory for the other side before sleeping on a doorbell pipe.

Watching costs a core; sleeping costs a wake-up (~10-50 us on a small VM, more under load). Both
ends of the doorbell link watch for up to `limit_s` when most answers lately came within it, and
sleep at once otherwise: a busy or distant peer gets no watcher, and an idle system has none.
Whoever watches yields the core on each look, so it never keeps a process that has work from
running.
"""

from __future__ import annotations


class AdaptiveSpin:
    def __init__(self, limit_s: float = 200e-6) -> None:
        self.limit_s = limit_s
        self.hit_rate = 1.0  # moving share of answers that came within limit_s

    def budget(self) -> float:
        """Seconds to watch before sleeping."""
        return self.limit_s if self.hit_rate > 0.5 and self.limit_s > 0 else 0.0

    def observe(self, seconds: float) -> None:
        self.hit_rate += 0.05 * ((seconds <= self.limit_s) - self.hit_rate)
