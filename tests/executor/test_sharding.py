"""The executor sharded over 2 and 4 ranks (torch.distributed, gloo on CPU) against the unsharded
executor and plain transformers + peft; and a rank that dies takes its group down cleanly."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import psutil
import pytest
import torch

from tests.helpers import ExecutorProcess
from tests.peft_reference import TOLERANCE, compare
from wire.call import messages as P
from workers.remote.client import ExecutorClient
from workers.remote.handle import ExecutorUnavailable

pytestmark = pytest.mark.slow
MODELS = ["tiny-llama", "tiny-gpt2"]


def layer_inputs(spec: P.LayerSpec, op: P.Op, rows: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if spec.kind == P.LayerKind.EMBEDDING:
        return torch.randint(0, spec.in_features, (rows,), generator=generator)
    width = spec.out_features if op == P.Op.BACKWARD else spec.in_features
    return torch.randn(rows, width, generator=generator)


@pytest.mark.parametrize("shards", [2, 4])
@pytest.mark.parametrize("model", MODELS)
def test_every_layer_equals_the_unsharded_executor(model: str, shards: int,
                                                   executor_for) -> None:
    whole = ExecutorClient(executor_for(model, no_fuse="", no_stretch="", no_head_loss="").endpoint,
                           name="whole")
    split = ExecutorClient(executor_for(model, shards=str(shards)).endpoint, name="split")
    try:
        assert [s.name for s in split.layers] == [s.name for s in whole.layers]
        for spec in whole.layers:
            ops = [P.Op.FORWARD] if spec.kind == P.LayerKind.EMBEDDING else list(P.Op)
            for op in ops:
                for rows in (1, 7):
                    x = layer_inputs(spec, op, rows, seed=spec.index * 10 + rows)
                    expected = whole.call(op, spec.index, x, P.CallKind.INFERENCE)
                    got = split.call(op, spec.index, x, P.CallKind.TRAINING)
                    assert got.shape == expected.shape, (spec.name, op)
                    # the same sums in another order (over up to 50k terms for the LM head's
                    # backward): equal to within 1e-5 of the largest value
                    error = (got - expected).abs().max().item()
                    scale = max(1.0, expected.abs().max().item())
                    assert error <= TOLERANCE * scale, (spec.name, op.name, error, scale)
    finally:
        whole.close()
        split.close()


@pytest.mark.parametrize("shards", [2, 4])
@pytest.mark.parametrize("model", MODELS)
def test_several_clients_train_and_decode_as_plain_peft(model: str, shards: int,
                                                        executor_for) -> None:
    endpoint = executor_for(model, shards=str(shards)).endpoint
    results: dict[str, dict] = {}

    def run(method: str) -> None:
        client = ExecutorClient(endpoint, name=f"{model}-{method}")
        try:
            results[method] = compare(model, method, client)
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(m,)) for m in ("lora", "ia3", "prompt_tuning")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(results) == {"lora", "ia3", "prompt_tuning"}
    for method, result in results.items():
        assert max(result["logits"], result["grads"], result["params"]) <= TOLERANCE, \
            (method, result)
        assert result["generate_equal"], (method, result)


def test_a_dead_rank_takes_the_group_down_cleanly(short_dir) -> None:
    executor = ExecutorProcess.start("tiny-llama", short_dir / "group.sock", shards="2")
    client = ExecutorClient(executor.endpoint, name="victim-watcher", call_timeout_s=30)
    try:
        spec = client.layers[1]
        x = layer_inputs(spec, P.Op.FORWARD, 2, seed=1)
        assert client.call(P.Op.FORWARD, 1, x, P.CallKind.INFERENCE).shape[0] == 2
        follower = psutil.Process(executor.proc.pid).children()[0]
        follower.kill()
        killed = time.monotonic()
        assert executor.proc.wait(15) != 0  # rank 0 leaves, so the launcher restarts the group
        with pytest.raises(ExecutorUnavailable) as failed:
            client.call(P.Op.FORWARD, 1, x, P.CallKind.INFERENCE)
        assert time.monotonic() - killed < 20
        assert ".cpp" not in str(failed.value) and "gloo" not in str(failed.value)
    finally:
        client.close()
        executor.stop()


def test_a_local_group_meets_through_a_private_file_and_listens_on_loopback_only(
        short_dir) -> None:
    """No rendezvous open to the network (torch's TCP store takes no credentials): the ranks
    meet through a file in a 0700 directory and connect over loopback."""
    executor = ExecutorProcess.start("tiny-llama", short_dir / "private-group.sock", shards="2")
    client = ExecutorClient(executor.endpoint, name="loopback-watcher")
    try:
        assert client.call(P.Op.FORWARD, 1, layer_inputs(client.layers[1], P.Op.FORWARD, 2, 1),
                           P.CallKind.INFERENCE).shape[0] == 2
        leader = psutil.Process(executor.proc.pid)
        ranks = [leader, *leader.children()]
        listening = [c.laddr for rank in ranks for c in rank.net_connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        assert all(address.ip in ("127.0.0.1", "::1") for address in listening), listening
        rendezvous = next(a for a in ranks[1].cmdline() if a.startswith(("file://", "tcp://")))
        assert rendezvous.startswith("file://")
        directory = rendezvous.removeprefix("file://").rsplit("/", 1)[0]
        assert os.stat(directory).st_mode & 0o077 == 0
    finally:
        client.close()
        executor.stop()



def test_a_dead_rank_is_noticed_while_a_collective_hangs_on_another(short_dir) -> None:
    """Of 3 ranks, one is frozen (SIGSTOP) while calls keep coming, so rank 0 sits in a
    collective waiting on it, holding the group's lock; then another is killed. Rank 0 notices
    the death on its own (the heartbeat, which waits on that lock, must not hold up the watch)
    and leaves at once, not after the collective's timeout."""
    executor = ExecutorProcess.start("tiny-llama", short_dir / "hung.sock", shards="3",
                                     shard_timeout_s="300")
    client = ExecutorClient(executor.endpoint, name="hung-load", call_timeout_s=300)
    spec = client.layers[1]
    x = layer_inputs(spec, P.Op.FORWARD, 4, seed=3)

    def load() -> None:
        with contextlib.suppress(ExecutorUnavailable):
            while True:
                client.call(P.Op.FORWARD, spec.index, x, P.CallKind.INFERENCE)

    frozen, doomed = psutil.Process(executor.proc.pid).children()
    try:
        threading.Thread(target=load, daemon=True).start()
        time.sleep(1.0)
        frozen.suspend()
        time.sleep(2.0)  # the calls' collective now waits on the frozen rank
        doomed.kill()
        assert executor.proc.wait(15) != 0
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            frozen.kill()
        client.close()
        executor.stop()
