"""An inference worker (its adapters, engine and executor client, in this process, against a
real executor process) takes the share of the cores the manager tells it: a long prompt's
prefill runs on as many of its threads as its tokens keep busy, decode steps on one."""

from __future__ import annotations

from collections import deque

import torch
import zmq

from tests.helpers import ExecutorProcess
from wire import manager as W
from wire.spawner import WorkerSpec
from workers.inference.preloaded import preload
from workers.inference.worker import _generate, _receive, build_adapters
from workers.threads import ForwardThreads

MODEL = "tiny-llama"


def test_a_worker_prefills_on_the_share_it_is_told(executor_for, threads_back) -> None:
    llama: ExecutorProcess = executor_for(MODEL)
    preloaded = preload(MODEL)
    spec = WorkerSpec(key="threads-worker", tenant="acme", base=MODEL, executor=llama.endpoint,
                      manager="inproc://unused", threads=1)  # spawned beside another worker
    threads = ForwardThreads(spec.threads)
    adapters = build_adapters(spec, preloaded, threads)
    seen: list[int] = []  # the threads of each forward of the worker's own layers
    adapters.engine.decode_model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda *_: seen.append(torch.get_num_threads()))

    def serve(request_id: str) -> list[int]:
        seen.clear()
        assert _generate(W.Generate(request_id, "acme", MODEL, W.SamplingParams(
            max_tokens=3, temperature=0), prompt_ids=list(range(5, 305))), adapters,
            preloaded) == []
        events: list[W.Message] = []
        while adapters.engine.has_work():
            events += adapters.engine.step()
        assert isinstance(events[-1], W.Done) and events[-1].completion_tokens == 3
        return list(seen)

    assert serve("before") == [1, 1, 1]  # a 300-token prefill, two decode steps
    ctx = zmq.Context()
    manager, worker = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        manager.setsockopt(zmq.ROUTER_MANDATORY, 1)
        manager.bind("inproc://manager")
        worker.setsockopt(zmq.IDENTITY, spec.key.encode())
        worker.connect("inproc://manager")
        manager.send_multipart([spec.key.encode(), W.encode(W.WorkerThreads(4))])
        assert _receive(worker, adapters, preloaded, threads, deque())  # the other one stopped
    finally:
        worker.close(0)
        manager.close(0)
        ctx.term()
    assert threads.share == 4
    assert serve("after") == [2, 1, 1]  # 300 tokens keep two threads busy; decode one
