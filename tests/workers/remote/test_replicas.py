"""Replica mode: clients spread over several executors and move on when theirs dies."""

from __future__ import annotations

import signal

import pytest
import torch

from tests.helpers import ExecutorProcess
from tests.peft_reference import TOLERANCE, compare
from wire.call import messages as P
from workers.remote.client import ExecutorClient
from workers.remote.handle import ExecutorUnavailable

pytestmark = pytest.mark.slow


@pytest.fixture()
def replicas(short_dir):
    started = [ExecutorProcess.start("tiny-llama", short_dir / f"{name}.sock")
               for name in ("a", "b")]
    yield started
    for executor in started:
        executor.stop()


def by_endpoint(replicas: list[ExecutorProcess], endpoint: str) -> ExecutorProcess:
    return next(r for r in replicas if r.endpoint == endpoint)


def test_clients_spread_over_the_replicas(replicas) -> None:
    listed = ",".join(r.endpoint for r in replicas)
    clients = [ExecutorClient(listed, name=f"worker-{i}") for i in range(8)]
    try:
        assert {c.endpoint for c in clients} == {r.endpoint for r in replicas}
    finally:
        for client in clients:
            client.close()


class KillsItsReplica(ExecutorClient):
    """Kills the replica it is on after `after` calls (mid-training)."""

    def __init__(self, *args, replicas: list[ExecutorProcess], after: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.processes, self.after, self.killed = replicas, after, None

    def call(self, op, layer, x, kind):
        if self.calls == self.after and self.killed is None:
            self.killed = self.endpoint
            by_endpoint(self.processes, self.endpoint).stop(signal.SIGKILL)
        return super().call(op, layer, x, kind)


def test_a_client_whose_replica_dies_mid_training_goes_on_unharmed(replicas) -> None:
    listed = ",".join(r.endpoint for r in replicas)
    client = KillsItsReplica(listed, name="trainer", replicas=replicas, after=40)
    try:
        result = compare("tiny-llama", "lora", client)
        assert client.killed is not None and client.endpoint != client.killed
        assert not by_endpoint(replicas, client.killed).alive()
    finally:
        client.close()
    assert max(result["logits"], result["grads"], result["params"]) <= TOLERANCE, result
    assert result["generate_equal"], result
    assert client.calls > 40


def test_a_lone_replica_going_away_is_still_an_error(replicas) -> None:
    client = ExecutorClient(replicas[0].endpoint, name="alone", connect_timeout_s=2,
                            call_timeout_s=5)
    try:
        x = torch.randn(2, client.layers[1].in_features)
        client.call(P.Op.FORWARD, 1, x, P.CallKind.INFERENCE)
        replicas[0].stop(signal.SIGKILL)
        with pytest.raises(ExecutorUnavailable):
            client.call(P.Op.FORWARD, 1, x, P.CallKind.INFERENCE)
    finally:
        client.close()
