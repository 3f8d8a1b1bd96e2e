"""The waits a step's calls carry, derived from a tenant's end-to-end targets and what the steps
measure (a fake clock and call counter; the figures worked by hand from the rule in
`workers.inference.pacing`)."""

from __future__ import annotations

import pytest

from wire import manager as W
from wire.call.messages import NO_TARGETS, CallTargets
from workers.inference.pacing import LaneWait, Pacer
from workers.inference.request import Request

OWN = CallTargets(decode_us=1000, prefill_us=50_000)  # the executor's own, as its welcome says


class Steps:
    """A pacer driven by hand: `now` in seconds, `calls` made so far; `carried` what it set."""

    def __init__(self) -> None:
        self.now, self.calls, self.own = 10.0, 0, OWN
        self.carried: list[CallTargets] = []
        self.pacer = Pacer(self.carried.append, lambda: self.calls, lambda: self.own,
                           clock=lambda: self.now)

    def step(self, admitted: list[Request], running: list[Request], seconds: float,
             calls: int) -> CallTargets:
        """Paces a step, then lets it take `seconds` and make `calls`; returns what it carried."""
        self.pacer.pace(admitted, running)
        self.now += seconds
        self.calls += calls
        return self.carried[-1]


def request(name: str, *, inter_token_ms: float = 0, ttft_ms: float = 0,
            targets: CallTargets = NO_TARGETS, arrived: float = 10.0) -> Request:
    return Request(name, [1, 2, 3], W.SamplingParams(max_tokens=8), targets=targets,
                   token_targets=W.TokenTargets.from_ms(ttft_ms, inter_token_ms), arrived=arrived)


def test_a_lane_wait_moves_by_half_the_slack_per_call_within_its_bounds() -> None:
    wait = LaneWait(5000)  # the executor's own: where it starts, and its ceiling
    assert wait.us == 5000
    wait.observe(target_us=100_000, measured_us=140_000, calls=10)  # 40 ms over: -2 ms a call
    assert wait.us == 3000
    wait.observe(target_us=100_000, measured_us=60_000, calls=10)  # 40 ms left: +2 ms a call
    assert wait.us == 5000
    wait.observe(target_us=100_000, measured_us=60_000, calls=10)  # never above its own
    assert wait.us == 5000
    wait.observe(target_us=100_000, measured_us=500_000, calls=10)  # far over: run at once
    assert wait.us == 1
    wait.observe(target_us=20_000, measured_us=0, calls=10)  # 20 ms left: +1 ms a call
    assert wait.us == 1001
    wait.observe(target_us=20_000, measured_us=0, calls=10)  # never above the target a call
    assert wait.us == 2000
    assert LaneWait(0).us == 1  # an executor that waits for nothing: neither does the pacer


def test_steps_of_an_inter_token_target_carry_waits_derived_from_their_measured_time() -> None:
    steps = Steps()
    tenant = request("a", inter_token_ms=100)
    # its first step admits it: nothing measured yet, so the executor's own decode wait
    assert steps.step([tenant], [], 0.05, 10) == CallTargets(1000, 0)
    # the step that admitted it prefilled too: only steps it decoded in are measured
    assert steps.step([], [tenant], 0.14, 10) == CallTargets(1000, 0)
    assert steps.step([], [tenant], 0.09, 10) == CallTargets(1, 0)  # 40 ms over
    assert steps.step([], [tenant], 0.05, 10) == CallTargets(501, 0)  # 10 ms to spare
    assert steps.step([], [], 0.0, 0) == NO_TARGETS  # it finished: 50 ms of room learned
    # (back up to the executor's own), but nothing asks for a derived wait any more
    assert steps.pacer.decode.us == 1000


def test_an_executor_with_other_waits_of_its_own_starts_the_lanes_again() -> None:
    steps = Steps()
    tenant = request("a", inter_token_ms=100, ttft_ms=500)
    steps.step([tenant], [], 0.05, 10)
    steps.step([], [tenant], 0.3, 10)
    # 200 ms over: at once; this step then spans a reconnect (3 s)
    assert steps.step([], [tenant], 3.0, 10) == CallTargets(1, 0)
    steps.own = CallTargets(decode_us=4000, prefill_us=20_000)  # a reconnect's welcome
    # the step across the reconnect teaches nothing: the new executor's own holds
    assert steps.step([], [tenant], 0.3, 10) == CallTargets(4000, 0)
    assert steps.pacer.prefill.us == 20_000
    assert steps.step([], [tenant], 0.3, 10) == CallTargets(1, 0)  # measured again: 200 over
    assert steps.pacer.decode.ceiling == 4000


def test_a_lane_the_tenant_set_itself_is_not_derived() -> None:
    steps = Steps()
    both = request("a", inter_token_ms=100, targets=CallTargets(decode_us=300))
    other = request("b", inter_token_ms=100)
    assert steps.step([], [both, other], 0.5, 10) == CallTargets(300, 0)
    assert steps.step([], [both, other], 0.5, 10) == CallTargets(300, 0)  # missed, yet 300
    assert steps.pacer.decode.us == 1  # learned all the same: the derived wait is for others
    assert steps.step([], [other], 0.0, 0) == CallTargets(1, 0)


def test_a_prefill_wait_follows_the_time_to_first_token_of_the_request_admitted() -> None:
    steps = Steps()
    early = request("early", ttft_ms=1000, arrived=9.0)  # waited 1 s before its step began
    assert steps.step([early], [], 0.2, 10) == CallTargets(0, 50_000)
    # its first token came 1.2 s after it arrived: 0.2 s over, half of it over 10 calls
    assert steps.step([], [early], 0.05, 10) == NO_TARGETS
    assert steps.pacer.prefill.us == pytest.approx(40_000)
    late = request("late", ttft_ms=2000, arrived=steps.now - 1.7)
    lax = request("lax", ttft_ms=60_000, arrived=steps.now)
    assert steps.step([late, lax], [early], 0.2, 10) == CallTargets(0, 40_000)
    steps.step([], [early, late, lax], 0.05, 10)
    # the one that kept least of its target counts: "late", 0.1 s to spare (not "lax")
    assert steps.pacer.prefill.us == pytest.approx(45_000)
    for _ in range(20):  # each step over its target: down to running as soon as possible
        steps.step([request("over", ttft_ms=1, arrived=steps.now - 1)], [], 0.1, 10)
    assert steps.pacer.prefill.us == 1


def test_a_step_that_made_no_call_teaches_nothing() -> None:
    steps = Steps()
    tenant = request("a", inter_token_ms=100)
    steps.step([], [tenant], 5.0, 0)  # a step of refusals: it reached no executor
    assert steps.step([], [tenant], 0.0, 0) == CallTargets(1000, 0)
    assert steps.pacer.decode.us == 1000


def test_requests_without_targets_carry_none() -> None:
    steps = Steps()
    plain = request("plain")
    for _ in range(3):
        assert steps.step([plain], [plain], 0.5, 10) == NO_TARGETS
