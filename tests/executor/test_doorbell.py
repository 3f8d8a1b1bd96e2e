"""A real executor process and doorbell clients (the call's header in shared memory): their
results are a socket client's, a header a real client never writes gets an error reply to its
sender only, and a client killed mid-call is forgotten at once."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from tests.helpers import ExecutorProcess
from wire.call import header as H
from wire.call import messages as P
from workers.remote.client import ExecutorClient


@pytest.fixture()
def llama(executor_for) -> ExecutorProcess:
    return executor_for("tiny-llama")


def test_doorbell_calls_match_socket_calls(llama: ExecutorProcess) -> None:
    fast = ExecutorClient(llama.endpoint, name="doorbell")
    plain = ExecutorClient(llama.endpoint, name="socket", use_doorbell=False)
    framed = ExecutorClient(llama.endpoint, name="frames", use_shm=False)
    assert (fast.doorbell, plain.doorbell, framed.doorbell) == (True, False, False)
    q = next(s.index for s in fast.layers if s.name.startswith("model.layers.0.self_attn.q_proj"))
    head = next(s.index for s in fast.layers if s.name == "lm_head")
    embed = next(s.index for s in fast.layers if s.name == "model.embed_tokens")
    torch.manual_seed(0)
    calls = [(P.Op.FORWARD, q, torch.randn(5, 64)), (P.Op.BACKWARD, q, None),
             (P.Op.FORWARD, embed, torch.tensor([3, 50_000, 7])),
             (P.Op.FORWARD, head, torch.randn(100, 64))]  # 20 MB: the shared memory grows
    for op, layer, x in calls:
        if x is None:
            x = torch.randn(5, fast.layers[layer].out_features)
        results = [c.call(op, layer, x, P.CallKind.TRAINING).clone()
                   for c in (fast, plain, framed)]
        assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])
    for c in (fast, plain, framed):
        c.close()


def test_bad_doorbell_header_gets_an_error_and_the_client_goes_on(llama: ExecutorProcess) -> None:
    client = ExecutorClient(llama.endpoint, name="scribbler")
    bystander = ExecutorClient(llama.endpoint, name="bystander")
    x = torch.randn(2, 64)
    expected = client.call(P.Op.FORWARD, 1, x, P.CallKind.INFERENCE).clone()
    fast = client._fast
    size = client._shm.size
    k = P.CallKind.INFERENCE
    bad = {  # (kind, dtype code, rank, layer, rows, cols, shm_in, shm_out) -> expected error
        (k, 99, 2, 1, 2, 64, H.DATA_AT, H.DATA_AT + 1024): P.ErrorCode.BAD_TENSOR,
        (k, 0, 3, 1, 2, 64, H.DATA_AT, H.DATA_AT + 1024): P.ErrorCode.BAD_TENSOR,
        (k, 0, 2, 10**6, 2, 64, H.DATA_AT, H.DATA_AT + 1024): P.ErrorCode.UNKNOWN_LAYER,
        (k, 0, 2, 1, 2, 65, H.DATA_AT, H.DATA_AT + 1024): P.ErrorCode.BAD_TENSOR,
        (k, 0, 2, 1, 2, 64, size - 64, H.DATA_AT): P.ErrorCode.BAD_TENSOR,
        (k, 0, 2, 1, 2, 64, H.DATA_AT, 0): P.ErrorCode.BAD_TENSOR,  # over the headers: overlap
        (k, 0, 2, 1, 2, 64, H.DATA_AT, H.DATA_AT + 8): P.ErrorCode.BAD_TENSOR,  # misaligned
        (k, 0, 2, 1, 10**9, 64, H.DATA_AT, H.DATA_AT + 1024): P.ErrorCode.BAD_TENSOR,
        (2, 0, 2, 1, 2, 64, H.DATA_AT, H.DATA_AT + 1024): P.ErrorCode.BAD_MESSAGE,  # no such kind
        (255, 0, 2, 1, 2, 64, H.DATA_AT, H.DATA_AT + 1024): P.ErrorCode.BAD_MESSAGE,
    }
    for (kind, dtype, ndim, layer, rows, cols, shm_in, shm_out), code in bad.items():
        fast.seq += 1
        H.publish_call(fast.mapped, fast.seq, 7, P.Op.FORWARD, kind, dtype, ndim, layer, rows,
                       cols, shm_in, shm_out)
        client._doorbell.ring()
        reply = fast._await(fast.seq, client._channel.check_alive, time.monotonic() + 30)
        assert reply[1] != H.OK
        assert H.read_error(fast.mapped, reply[1], reply[6])[0] == code, (kind, dtype, layer)
        assert torch.equal(bystander.call(P.Op.FORWARD, 1, x, P.CallKind.INFERENCE), expected)
    assert torch.equal(client.call(P.Op.FORWARD, 1, x, P.CallKind.INFERENCE), expected)
    client.close()
    bystander.close()


def test_killed_doorbell_client_is_forgotten_at_once(llama: ExecutorProcess) -> None:
    code = ("import sys, time, torch; from wire.call import messages as P; "
            "from workers.remote import ExecutorClient; "
            f"c = ExecutorClient({llama.endpoint!r}, name='doomed'); assert c.doorbell; "
            "head = next(s.index for s in c.layers if s.name == 'lm_head'); "
            "c.call(P.Op.FORWARD, 1, torch.randn(1, 64), P.CallKind.INFERENCE); "
            "print('ready', flush=True)\n"
            "while True: c.call(P.Op.FORWARD, head, torch.randn(300, 64), P.CallKind.INFERENCE)")
    watcher = ExecutorClient(llama.endpoint, name="watcher")
    before = watcher.stats().clients
    log_from = len(llama.log)
    for _ in range(3):  # killed at different points of its calls: mid-call, mid-reply
        doomed = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            assert doomed.stdout.readline().strip() == "ready"
            time.sleep(0.3)
            doomed.kill()
            doomed.wait()
            deadline = time.monotonic() + 5  # the idle timeout is minutes; the pipe tells at once
            while watcher.stats().clients != before:
                assert time.monotonic() < deadline, "the executor still counts the dead client"
                time.sleep(0.05)
            assert watcher.call(P.Op.FORWARD, 1, torch.randn(1, 64),
                                P.CallKind.INFERENCE).shape == (1, 64)
        finally:
            doomed.kill()
    watcher.close()
    assert llama.alive()
    assert not any("Traceback" in line for line in llama.log[log_from:])
