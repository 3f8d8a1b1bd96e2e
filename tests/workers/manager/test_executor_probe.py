"""The manager's torch-free probe of the executor: whether it answers, its figures, and whether
it computes the head's loss for trainers (which the job budget counts: `capacity.JobBudget`),
said once as it first does (the manager then schedules queued jobs again)."""

from __future__ import annotations

import time

import pytest
import zmq

from workers.manager.executor_probe import ExecutorProbe, ExecutorProbes


def answers(probe: ExecutorProbe, count: int, timeout_s: float = 20.0) -> list[bool]:
    """As the manager asks (again each second: a request sent before the connection is up is
    dropped), until `count` answers came: what `receive` said of each."""
    poller = zmq.Poller()
    poller.register(probe.socket, zmq.POLLIN)
    deadline = time.monotonic() + timeout_s
    said: list[bool] = []
    while len(said) < count and time.monotonic() < deadline:
        probe.ask(poller)
        heard = probe.last_answer
        if poller.poll(1000):
            offered = probe.receive()
            if probe.last_answer > heard:
                said.append(offered)
    return said


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
    said = answers(probe, 2)
    assert probe.alive and probe.figures is not None
    assert probe.offers_head_loss is offers
    assert said == [offers, False]  # the manager schedules again when it first hears the offer
    probe.close()
    ctx.term()


def test_the_jobs_own_executor_is_probed_beside_the_serving_one(executor_for) -> None:
    """With an executor for the fine-tuning jobs (the idle twin), the manager hears both, each
    its own figures (here two executors that differ in offering the head's loss); without one,
    or with the serving one named, it probes one."""
    ctx = zmq.Context()
    serving = executor_for("tiny-llama").endpoint
    training = executor_for("tiny-llama", no_head_loss="").endpoint
    for alone in (ExecutorProbes(serving, "", ctx), ExecutorProbes(serving, serving, ctx)):
        assert alone.training is None and alone.training_up() is None
        alone.close()
    probes = ExecutorProbes(serving, training, ctx)
    assert probes.training_up() is False  # not heard yet
    poller = zmq.Poller()
    probes.register(poller)
    deadline = time.monotonic() + 20
    while None in probes.figures() and time.monotonic() < deadline:
        probes.ask(poller)
        probes.receive(dict(poller.poll(1000)))
    heard, trained = probes.figures()
    assert heard is not None and trained is not None
    assert heard.head_loss and not trained.head_loss
    assert probes.training_up() is True
    probes.close()
    ctx.term()
