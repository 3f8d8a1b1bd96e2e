"""Whether a way of making a step pays where it runs, measured rather than assumed.

A greedy call (`workers.remote.tail`) saves the next step's first call but makes the executor
pick the choice and run the lead on it; which costs more depends on the host (on a small CPU
executor, right after streaming a 50k-row head out of its caches, about as much as a call).
So the steps alternate between the two ways for a while (`PROBE` steps), the way with the
shorter median step is kept for `KEEP` steps, and then it is measured again. A step is the time
from one call of `step` to the next (medians: a pause between requests is an outlier).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

PROBE = 32  # steps, half each way
KEEP = 512


class Trial:
    def __init__(self, clock: Callable[[], float] = time.perf_counter, probe: int = PROBE,
                 keep: int = KEEP) -> None:
        self.clock, self.probe, self.keep = clock, probe, keep
        self.fixed: bool | None = None  # always (True) or never (False) the way, unmeasured
        self.chosen = True
        self.left = probe  # steps left in this phase
        self.probing = True
        self.samples: tuple[list[float], list[float]] = ([], [])  # step seconds without, with
        self.started: float | None = None  # when the step being timed began
        self.took = False  # whether it took the way

    def step(self) -> bool:
        """A step begins: whether it takes the way."""
        if self.fixed is not None:
            return self.fixed
        now = self.clock()
        if self.probing and self.started is not None:
            self.samples[self.took].append(now - self.started)
        self.left -= 1
        if self.left < 0:
            self._next_phase()
        self.took = not self.took if self.probing else self.chosen
        self.started = now if self.probing else None
        return self.took

    def interrupt(self) -> None:
        """The step being timed did not run as either way would (it was not a step of the
        trial): no sample of it."""
        self.started = None

    def _next_phase(self) -> None:
        without, with_ = self.samples
        if self.probing and without and with_:
            self.chosen = statistics.median(with_) <= statistics.median(without)
        self.probing = not self.probing or not (without and with_)
        self.left = self.probe if self.probing else self.keep
        self.samples = ([], [])
