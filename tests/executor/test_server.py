"""A real executor process: bad input gets an error reply to its sender only; others keep going."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import msgspec
import pytest
import torch
import zmq

from tests.helpers import ExecutorProcess
from wire.call import messages as P
from wire.call.tensors import as_bytes
from workers.remote.client import ExecutorClient
from workers.remote.handle import ExecutorUnavailable


class RawClient:
    """A bare DEALER speaking the protocol by hand, to send what a real client never would."""

    def __init__(self, endpoint: str, hello: bool = True) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        if hello:
            self.send(P.encode(P.Hello("raw", 1)))
            self.welcome = self.recv()

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def recv(self, timeout_ms: int = 10_000):
        assert self.sock.poll(timeout_ms), "no reply from the executor"
        frames = self.sock.recv_multipart()
        return P.decode_reply(frames[0]), frames[1:]

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture()
def llama(executor_for) -> ExecutorProcess:
    return executor_for("tiny-llama")


@pytest.fixture()
def own_llama(ipc_dir) -> Iterator[ExecutorProcess]:
    """An executor of the test's own: what its clients leave behind, and its figures, are the
    test's alone (the shared one may still be running calls earlier tests left behind)."""
    proc = ExecutorProcess.start("tiny-llama", ipc_dir / "own.sock")
    yield proc
    proc.stop()


def layer_index(client: RawClient, name: str) -> int:
    welcome, _ = client.welcome
    return next(s.index for s in welcome.layers if s.name == name)


def call(layer: int, x: torch.Tensor, op: P.Op = P.Op.FORWARD, call_id: int = 1) -> list[bytes]:
    header = P.Call(call_id, op, layer, P.CallKind.INFERENCE, str(x.dtype)[6:], tuple(x.shape))
    return [P.encode(header), bytes(as_bytes(x))]


def error_of(client: RawClient, *frames: bytes) -> P.Error:
    client.send(*frames)
    reply, _ = client.recv()
    assert isinstance(reply, P.Error), reply
    return reply


def test_bad_input_gets_an_error_and_others_keep_being_served(llama: ExecutorProcess) -> None:
    good = ExecutorClient(llama.endpoint, name="bystander")
    bad = RawClient(llama.endpoint)
    q = layer_index(bad, "model.layers.0.self_attn.q_proj")
    emb = layer_index(bad, "model.embed_tokens")
    lead = layer_index(bad, "model.embed_tokens.lead")
    greedy = layer_index(bad, "model.layers.1.stretch+lm_head+lead")
    stretch = layer_index(bad, "model.layers.0.stretch")
    x = torch.randn(3, 64)
    expected = good.call(P.Op.FORWARD, q, x, P.CallKind.INFERENCE).clone()
    cases = {
        "unknown layer": (call(10_000, x), P.ErrorCode.UNKNOWN_LAYER),
        "wrong width": (call(q, torch.randn(3, 65)), P.ErrorCode.BAD_TENSOR),
        "wrong rank": (call(q, torch.randn(3, 4, 64)), P.ErrorCode.BAD_TENSOR),
        "wrong dtype": (call(q, torch.ones(3, 64, dtype=torch.int64)), P.ErrorCode.BAD_TENSOR),
        "truncated frame": ([call(q, x)[0], bytes(as_bytes(x))[:-8]], P.ErrorCode.BAD_TENSOR),
        "missing frame": (call(q, x)[:1], P.ErrorCode.BAD_TENSOR),
        "ids out of range": (call(emb, torch.tensor([1, 10**6])), P.ErrorCode.BAD_TENSOR),
        "a negative id": (call(emb, torch.tensor([-1])), P.ErrorCode.BAD_TENSOR),
        "one bad id of many": (call(emb, torch.cat([torch.arange(40), torch.tensor([-3])])),
                               P.ErrorCode.BAD_TENSOR),
        "backward of a table": (call(emb, torch.tensor([1]), P.Op.BACKWARD),
                                P.ErrorCode.UNSUPPORTED),
        "ids out of the lead's range": (call(lead, torch.tensor([10**6])),
                                        P.ErrorCode.BAD_TENSOR),
        "rows to the lead": (call(lead, torch.randn(2, 64)), P.ErrorCode.BAD_TENSOR),
        "backward of the lead": (call(lead, torch.tensor([1]), P.Op.BACKWARD),
                                 P.ErrorCode.UNSUPPORTED),
        "ids to greedy": (call(greedy, torch.tensor([1])), P.ErrorCode.BAD_TENSOR),
        "backward of greedy": (call(greedy, torch.randn(2, 128), P.Op.BACKWARD),
                               P.ErrorCode.UNSUPPORTED),
        # [inputs 128 | output gradients 256] without the residual output (64) between them
        "a stretch backward without its output": (call(stretch, torch.randn(2, 384), P.Op.BACKWARD),
                                                  P.ErrorCode.BAD_TENSOR),
        "unknown message type": ([msgspec.msgpack.encode(["fly", 1])], P.ErrorCode.BAD_MESSAGE),
        "garbage": ([b"\xff\x00garbage"], P.ErrorCode.BAD_MESSAGE),
        "empty": ([b""], P.ErrorCode.BAD_MESSAGE),
        "a negative latency target": ([P.encode(P.Call(1, P.Op.FORWARD, q, P.CallKind.INFERENCE,
                                                       "float32", (3, 64), decode_target_us=-1)),
                                        bytes(as_bytes(x))], P.ErrorCode.BAD_MESSAGE),
        "a latency target past 32 bits": ([P.encode(P.Call(
            1, P.Op.FORWARD, q, P.CallKind.INFERENCE, "float32", (3, 64),
            prefill_target_us=P.TARGET_MAX_US + 1)), bytes(as_bytes(x))], P.ErrorCode.BAD_MESSAGE),
        "no such kind of call": ([msgspec.msgpack.encode(["call", 1, 0, q, 7, "float32", [3, 64]])],
                                 P.ErrorCode.BAD_MESSAGE),
        "a decode mark that is no bool": ([msgspec.msgpack.encode(  # P.Call's fields in order
            ["call", 1, 0, q, 0, "float32", [3, 64], -1, -1, 0, 0, 2])], P.ErrorCode.BAD_MESSAGE),
        "shm without shm": ([P.encode(P.Call(1, P.Op.FORWARD, q, P.CallKind.INFERENCE,
                                             "float32", (3, 64), 0, 1024))],
                            P.ErrorCode.BAD_TENSOR),
    }
    for label, (frames, code) in cases.items():
        error = error_of(bad, *frames)
        assert error.code == code, label
        assert error.message, label
        after = good.call(P.Op.FORWARD, q, x, P.CallKind.INFERENCE)
        assert torch.equal(after, expected), f"bystander hurt after {label}"
    bad.close()
    good.close()
    assert llama.alive()


def test_calls_before_hello_are_refused(llama: ExecutorProcess) -> None:
    stranger = RawClient(llama.endpoint, hello=False)
    error = error_of(stranger, *call(1, torch.randn(1, 64)))
    assert error.code == P.ErrorCode.UNKNOWN_CLIENT
    stranger.close()


def test_client_vanishing_mid_call_does_not_disturb_others(own_llama: ExecutorProcess) -> None:
    good = ExecutorClient(own_llama.endpoint, name="survivor")
    for _ in range(5):
        ghost = RawClient(own_llama.endpoint)
        head = layer_index(ghost, "lm_head")
        ghost.send(*call(head, torch.randn(512, 64)))
        ghost.close()  # gone before its reply
    x = torch.randn(2, 64)
    head = next(s.index for s in good.layers if s.name == "lm_head")
    y = good.call(P.Op.FORWARD, head, x, P.CallKind.INFERENCE)
    assert y.shape == (2, 50259)
    good.close()
    assert own_llama.alive()


def test_stats_as_typed_figures_and_as_the_gateway_renders_them(
        own_llama: ExecutorProcess) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from gateway.metrics import Metrics
    from wire import manager as W

    client = ExecutorClient(own_llama.endpoint, name="stats")
    before = client.stats().kinds["inference"].rows
    client.call(P.Op.FORWARD, 1, torch.randn(4, 64), P.CallKind.INFERENCE)
    client.call(P.Op.FORWARD, 1, torch.randn(4, 64), P.CallKind.TRAINING)
    figures = client.stats()
    client.close()
    assert figures.kinds["inference"].rows == before + 4
    assert 0 < figures.training_share <= 1 and figures.training_share_floor == 0.25
    text = Metrics().render(W.StatusReply([], True, {}, figures)).decode()
    samples = {(s.name, s.labels.get("kind", s.labels.get("le", ""))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("symbiosis_executor_rows_total", "inference")] == before + 4
    assert samples[("symbiosis_executor_training_share", "")] == figures.training_share
    assert samples[("symbiosis_executor_wait_ms_count", "inference")] == \
        figures.kinds["inference"].wait_ms.count


def test_sigterm_exits_cleanly_and_clients_see_it(ipc_dir) -> None:
    proc = ExecutorProcess.start("tiny-llama", ipc_dir / "sigterm.sock")
    client = ExecutorClient(proc.endpoint, name="orphan", heartbeat_s=0.5)
    client.call(P.Op.FORWARD, 1, torch.randn(1, 64), P.CallKind.INFERENCE)
    started = time.monotonic()
    assert proc.stop(signal.SIGTERM) == 0
    assert time.monotonic() - started < 5
    assert any("executor stopping" in line for line in proc.log)
    assert any("executor stopped" in line for line in proc.log)
    with pytest.raises(ExecutorUnavailable):
        client.call(P.Op.FORWARD, 1, torch.randn(1, 64), P.CallKind.INFERENCE)
    client.close()


def test_restarted_executor_is_rejoined_transparently(ipc_dir) -> None:
    path = ipc_dir / "restart.sock"
    proc = ExecutorProcess.start("tiny-llama", path)
    client = ExecutorClient(proc.endpoint, name="phoenix")
    x = torch.randn(2, 64)
    before = client.call(P.Op.FORWARD, 1, x, P.CallKind.INFERENCE).clone()
    proc.stop()
    proc = ExecutorProcess.start("tiny-llama", path)
    try:
        after = client.call(P.Op.FORWARD, 1, x, P.CallKind.INFERENCE)
        assert torch.equal(before, after)
    finally:
        client.close()
        proc.stop()


def test_a_failed_hello_leaves_nothing_in_shared_memory(ipc_dir) -> None:
    from wire.call.shm import SHM_DIR

    def ours() -> set[str]:
        return {p.name for p in SHM_DIR.glob(f"symbiosis*-{os.getpid()}-*")}

    before = ours()
    with pytest.raises(ExecutorUnavailable):
        ExecutorClient(f"ipc://{ipc_dir}/nobody.sock", name="lonely", connect_timeout_s=0.5)
    assert ours() == before
