"""The executor's answers to socket messages (`executor.requests`), in process on a real registry
and scheduler: a goodbye forgets the client, and no batch waits for it from then on (the server
forgets a client that hung up its doorbell by the same `Requests.forget`)."""

from __future__ import annotations

import os

import torch
import zmq

from catalogue.resolve import resolve_model
from executor.clients import ClientTable
from executor.config import ExecutorConfig
from executor.policy import Opportunistic
from executor.registry import LayerRegistry
from executor.requests import Requests
from executor.stats import ExecutorStats
from executor.validation import CallTable
from tests.executor.queued import BUDGETS, clients_of, scheduler
from wire.call import messages as P
from wire.call.tensors import as_bytes


def test_a_goodbye_forgets_the_client_and_no_batch_waits_for_it(clock) -> None:
    registry = LayerRegistry.load(resolve_model("tiny-llama"), fuse=False, stretch=False,
                                  head_loss=False, huge_pages=False)
    q, k = (next(s for s in registry.specs if s.name.endswith(f"layers.0.self_attn.{name}_proj"))
            for name in ("q", "k"))
    s, clients, sent = scheduler(Opportunistic(BUDGETS), clock), ClientTable("cpu"), []
    requests = Requests(registry, ExecutorConfig(bind="tcp://127.0.0.1:5555"), s, clients,
                        ExecutorStats(), CallTable(registry.specs),
                        lambda identity, message: sent.append((identity, message)), None)

    def handle(identity: bytes, message: P.Call | P.Hello | P.Bye) -> None:
        frames = [zmq.Frame(P.encode(message))]
        if isinstance(message, P.Call):
            frames.append(zmq.Frame(as_bytes(torch.randn(message.shape))))
        requests.handle(identity, frames)

    def call(identity: bytes, layer: int) -> None:
        handle(identity, P.Call(0, P.Op.FORWARD, layer, P.CallKind.INFERENCE, "float32",
                                (1, q.in_features)))

    for identity in (b"a", b"b", b"c"):
        handle(identity, P.Hello(identity.decode(), os.getpid()))
    for layer in (q.index, k.index, q.index):  # each learns that k follows q; all wait after q
        for identity in (b"a", b"b", b"c"):
            call(identity, layer)
        while s.next_batch():
            pass
    handle(b"b", P.Bye())
    assert clients.get(b"b") is None and clients.get(b"a") is not None
    call(b"a", k.index)
    assert s.next_batch() is None  # c may still come
    call(b"c", k.index)
    assert clients_of(s.next_batch()) == ["a", "c"]  # at once: b will not
    assert [m for _, m in sent if isinstance(m, P.Error)] == []
