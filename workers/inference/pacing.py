"""The waits an engine's executor calls carry, per step, as its requests' tenants ask.

A tenant may ask for waits per call (`CallTargets`: the tightest of a step's requests is sent
as it is) or for what its clients meet end to end (`wire.manager.TokenTargets`: the time to
first token and between tokens). From an end-to-end target the pacer derives the calls' waits
in a lane the tenant did not set itself, from what the engine's steps measure: each step of
running sequences gives each of them a token, so the time from one step's start to the next is
the time between their tokens; the step a request was admitted in ends with its first token
(timed from `Request.arrived`: when the gateway had the whole request, as the worker manager
reckons it, so the gateway's handling and waits for a worker count, as in the gateway's count).
After such a step, the lane's wait per call moves by half the step's slack (the target less
what was measured, negative when missed) spread over the step's calls, within [1 us, the
executor's own wait] and never above the whole target over the calls. A step that missed cuts
the waits, down to running as soon as the executor can; steps that meet it with room let them
back up to the executor's own. An end-to-end target thus only ever shortens what waiting adds:
aimed at, a target would be missed by about every other token, and waiting longer than the
executor's own for a fuller batch did not pay on the traces measured (bench NOTES,
opportunistic vs eager). Until a step has been measured, the executor's own waits hold; so
they do again after the client reconnected to an executor that names other waits of its own (a
restarted one with other settings, another replica): what was learnt was about the old one.
A worker's engines share one executor client, so a step's time and calls, from its start to
the engine's next, include the other engines' steps between: what its sequences wait for too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from wire.call.messages import CallTargets, tightest
from workers.inference.request import Request

GAIN = 0.5  # of a step's slack that moves the waits (the rest absorbs a step's noise)


class LaneWait:
    """One lane's wait per call, moved by what each measured step left of its target, from and
    never above the executor's own (`own_us`)."""

    def __init__(self, own_us: int) -> None:
        self.ceiling = self.us = 0.0  # never an executor's own (at least 1 us): `follow` sets it
        self.follow(own_us)

    def follow(self, own_us: int) -> bool:
        """Start again from the executor's own wait if it is not the one this lane had."""
        ceiling = float(max(own_us, 1))
        if ceiling == self.ceiling:
            return False
        self.ceiling = self.us = ceiling
        return True

    def observe(self, target_us: int, measured_us: float, calls: int) -> None:
        calls = max(calls, 1)
        highest = max(min(self.ceiling, target_us / calls), 1.0)
        self.us = min(max(self.us + GAIN * (target_us - measured_us) / calls, 1.0), highest)


class Pacer:
    def __init__(self, carry: Callable[[CallTargets], None], calls: Callable[[], int],
                 own: Callable[[], CallTargets],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._carry = carry  # sets what the next calls carry
        self._calls = calls  # how many calls the executor client has made so far
        self._own = own  # the executor's own waits, as its last welcome named them
        self._clock = clock
        first = own()
        self.decode = LaneWait(first.decode_us)
        self.prefill = LaneWait(first.prefill_us)
        self._step: tuple[float, int, int, list[tuple[int, float]]] | None = None
        # the step begun last: its start, the calls made by then, the tightest inter-token
        # target of its running requests (0: none), each admitted request's ttft target and
        # arrival (those that asked one)

    def pace(self, admitted: Sequence[Request], running: Sequence[Request]) -> None:
        """Before a step that admits `admitted` and decodes `running`: learn from the step
        before, then set what this step's calls carry."""
        now, calls, own = self._clock(), self._calls(), self._own()
        moved = [lane.follow(us) for lane, us in ((self.decode, own.decode_us),
                                                  (self.prefill, own.prefill_us))]
        if not any(moved):  # a step across a reconnect measured the reconnect, too
            self._learn(now, calls)
        requests = [*admitted, *running]
        asked = tightest(r.targets for r in requests)
        inter_token = _tightest(r.token_targets.inter_token_us for r in running)
        first = [(r.token_targets.ttft_us, r.arrived) for r in admitted
                 if r.token_targets.ttft_us]
        self._step = (now, calls, inter_token, first)
        decode, prefill = asked.decode_us, asked.prefill_us
        if not decode and (inter_token or
                           _tightest(r.token_targets.inter_token_us for r in admitted)):
            decode = round(self.decode.us)
        if not prefill and first:
            prefill = round(self.prefill.us)
        self._carry(CallTargets(decode, prefill))

    def _learn(self, now: float, calls: int) -> None:
        if self._step is None:
            return
        began, before, inter_token, first = self._step
        made = calls - before
        if made <= 0:  # nothing reached the executor (a step of refusals only)
            return
        if inter_token:
            self.decode.observe(inter_token, (now - began) * 1e6, made)
        if first:  # the admitted request that kept least of its target
            target, waited = min(((t, (now - arrived) * 1e6) for t, arrived in first),
                                 key=lambda pair: pair[0] - pair[1])
            self.prefill.observe(target, waited, made)


def _tightest(targets: Iterable[int]) -> int:
    return min((t for t in targets if t), default=0)
