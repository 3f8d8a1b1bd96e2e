"""A real executor process counts each call against the latency target its tenants asked for,
whether the call came through shared memory and the doorbell or over the socket."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import ExecutorProcess
from wire.call import messages as P
from workers.remote.client import ExecutorClient


@pytest.fixture()
def llama(executor_for) -> ExecutorProcess:
    return executor_for("tiny-llama")


def _lane(client: ExecutorClient, lane: str) -> tuple[int, int]:
    figures = client.stats().lanes[lane]
    return figures.calls, figures.met


@pytest.mark.parametrize("doorbell", [True, False], ids=["doorbell", "socket"])
def test_each_call_is_counted_against_its_own_target(llama: ExecutorProcess,
                                                     doorbell: bool) -> None:
    client = ExecutorClient(llama.endpoint, name=f"targets-{doorbell}", use_doorbell=doorbell)
    try:
        assert (client._fast is not None) == doorbell  # the path this case is about
        step, prompt = torch.randn(1, 64), torch.randn(64, 64)

        def calls(targets: P.CallTargets, x: torch.Tensor, lane: str) -> tuple[int, int]:
            client.targets = targets
            before = _lane(client, lane)
            for _ in range(5):
                client.call(P.Op.FORWARD, 1, x, P.CallKind.INFERENCE)
            after = _lane(client, lane)
            return after[0] - before[0], after[1] - before[1]

        # a microsecond: no call is queued and picked that fast, so none meets it
        assert calls(P.CallTargets(1, P.TARGET_MAX_US), step, "decode") == (5, 0)
        assert calls(P.CallTargets(P.TARGET_MAX_US, 1), step, "decode") == (5, 5)
        # a prefill (over 32 rows) goes by the prefill target it carries, not the decode one
        assert calls(P.CallTargets(P.TARGET_MAX_US, 1), prompt, "prefill") == (5, 0)
        assert calls(P.CallTargets(1, P.TARGET_MAX_US), prompt, "prefill") == (5, 5)
        # the stats still name the executor's own targets
        lanes = client.stats().lanes
        assert (lanes["decode"].target_ms, lanes["prefill"].target_ms) == (1.0, 50.0)
        assert client.own_targets == P.CallTargets(1000, 50_000)  # as its welcome names them
    finally:
        client.close()
