"""Training's share of the executor's batches: what inference must leave it.

Training keeps at least `floor` of the batches that ran while it had work (a call queued, or a
sliced batch of its running), over the last `WINDOW` such batches; each slice of a training
batch counts as one. Batches that ran while training had nothing queued (its trainers computing
their own part of a step, or no job at all) count for neither side: training builds no debt then,
so it never takes a burst of the executor back from decoding tenants. The window is long, so what
training ran while inference was idle (between requests) is credit: while its share stays above
the floor, a training batch leaves the executor to decode steps about to come
(`Scheduler.hold_training`) instead of slicing into a token (a 64-batch window held at most 48
decode batches of credit, ~4 tokens of llama-160m; Azure trace + 2 jobs, 2 cores, bench NOTES).
"""

from __future__ import annotations

from collections import deque

WINDOW = 1024


class TrainingShare:
    def __init__(self, floor: float, window: int = WINDOW) -> None:
        self.floor = floor
        self.queued = 0  # training calls queued now
        self._recent: deque[bool] = deque(maxlen=window)  # was each counted batch training?
        self._training = 0  # how many of them were

    def record(self, training: bool, has_work: bool = False) -> None:
        """A batch (or a slice of one) ran; a non-training one counts while training
        `has_work` (a batch of its in slices) or has a call queued."""
        if not (training or has_work or self.queued):
            return
        if len(self._recent) == self._recent.maxlen:
            self._training -= self._recent[0]
        self._recent.append(training)
        self._training += training

    def of_recent(self) -> float:
        return self._training / len(self._recent) if self._recent else 0.0

    def kept(self) -> bool:
        """Whether training has at least its floor of the recent batches."""
        return self.of_recent() >= self.floor
