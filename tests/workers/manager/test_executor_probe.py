"""The manager's torch-free probe of the executor: whether it answers, its figures, and whether
it computes the head's loss for trainers (which the job budget counts: `capacity.JobBudget`)."""

from __future__ import annotations

import time

import pytest
import zmq

from workers.manager.executor_probe import ExecutorProbe


def answered(probe: ExecutorProbe, timeout_s: float = 20.0) -> ExecutorProbe:
    """As the manager asks: again each second (a request sent before the connection is up is
    dropped)."""
    poller = zmq.Poller()
    poller.register(probe.socket, zmq.POLLIN)
    deadline = time.monotonic() + timeout_s
    while not probe.alive and time.monotonic() < deadline:
        probe.ask(poller)
        if poller.poll(1000):
            probe.receive()
    return probe


@pytest.mark.parametrize(("model", "options", "offers"), [
    ("tiny-llama", {}, True),
    ("tiny-llama", {"no_head_loss": ""}, False),
    ("tiny-gemma2", {}, False),  # soft-capped logits: not the head's output
])
def test_the_probe_learns_whether_the_executor_computes_the_head_loss(
        executor_for, model: str, options: dict, offers: bool) -> None:
    ctx = zmq.Context()
    probe = ExecutorProbe(executor_for(model, **options).endpoint, ctx)
    assert not probe.offers_head_loss  # nothing heard yet: the logits are counted
    assert answered(probe).alive and probe.figures is not None
    assert probe.offers_head_loss is offers
    probe.close()
    ctx.term()
