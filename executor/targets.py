"""Latency targets per lane, and the training slice that keeps the decode target.

A target is how long a call of its lane may wait in the executor before its batch runs: a
decode step's wait adds straight to a token's latency (a token is 13 calls of llama-160m with
stretches, ~3.5 ms each on 2 cores: 5 ms a call let training add 33-72 % to a lightly loaded
trace's tokens, 1 ms 9-43 %, bench NOTES "mixed on the Azure trace"), a prefill's to the time to
first token. Training has none: it fills the gaps. These are the executor's own; a tenant may
ask for its own (the tenants file's `decode_target_ms`, `prefill_target_ms`), which each of its
calls carries (`wire.call.messages.CallTargets`: a worker batching several tenants sends the
tightest). Such a call waits for company (a fuller batch, its convoy) no longer than its target
(`Scheduler.add`, `executor.readiness`). The stats count, per lane, the calls that met their own
target (`/metrics`, the dashboard).

A decode step that arrives while a training batch runs waits for the slice in progress, so the
slice is sized from the decode target and what the waits measure (`SliceTuner`): it starts at
the target; over each window of decode calls queued while a training slice ran (the waits that
are the slices' doing: on a busy host most of a wait can be the OS's), if more than `MISS_SHARE`
missed their target the slice shrinks, if none came within half of it the slice grows back
(never above the decode target, nor above a tighter one that the window's calls carried, never
below `floor_s`, which a tenant's target cannot lower; `executor.columns` cuts a slice as a band
of the matmul's output columns, none narrower than its floor, so training keeps an efficient
matmul).
"""

from __future__ import annotations

from dataclasses import dataclass

from executor.lanes import Lane
from wire.call.messages import CallTargets

MISS_SHARE = 0.05  # of a window's decode calls that may miss the target before slices shrink
SHRINK, GROW = 0.7, 1.25


@dataclass(frozen=True)
class LatencyTargets:
    decode_s: float = 0.001
    prefill_s: float = 0.050

    def carried(self) -> CallTargets:
        """These targets as a call would carry them (`Welcome` tells them to each client)."""
        return CallTargets.from_ms(self.decode_s * 1000, self.prefill_s * 1000)

    def of(self, lane: Lane | int) -> float | None:
        return {Lane.DECODE: self.decode_s, Lane.PREFILL: self.prefill_s}.get(Lane(lane))


class SliceTuner:
    def __init__(self, target_s: float, initial_s: float | None = None,
                 floor_s: float = 0.0005, window: int = 128) -> None:
        self.target_s = target_s
        self.floor_s = min(floor_s, target_s)
        self.slice_s = target_s if initial_s is None else initial_s
        self.window = window
        self._seen = self._missed = self._slow = 0
        self._tightest = target_s  # the tightest target among the window's calls

    def observe(self, wait_s: float, own_target_s: float | None = None) -> None:
        """One decode call's wait behind training, against the target its tenants asked for
        (None: the executor's); adjusts `slice_s` per window."""
        target = self.target_s if own_target_s is None else own_target_s
        self._seen += 1
        self._missed += wait_s > target
        self._slow += wait_s > 0.5 * target
        self._tightest = min(self._tightest, target)
        if self._seen < self.window:
            return
        if self._missed > MISS_SHARE * self._seen:
            self.slice_s = max(self.floor_s, self.slice_s * SHRINK)
        elif self._slow == 0:
            self.slice_s = max(self.floor_s, min(self._tightest, self.slice_s * GROW))
        self._seen = self._missed = self._slow = 0
        self._tightest = self.target_s
