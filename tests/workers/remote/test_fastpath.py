"""A client's fast path against a stand-in executor thread that answers through the same shared
memory header and doorbell pipes: the results arrive, and each layer and kind of call earns its
own verdict on watching (a slow layer does not make a fast one sleep, nor slow training calls a
fast layer's inference calls)."""

from __future__ import annotations

import os
import threading
import time

import torch

from wire.call import doorbell as bell
from wire.call import header as H
from wire.call.messages import CallKind, LayerKind, LayerSpec, Op
from wire.call.shm import ShmBuffer
from workers.remote.fastpath import FastPath

FAST, SLOW = 0, 1
SLOW_S = 0.06
LIMIT_S = 0.02  # far above a thread's answer, far below the slow layer's


def _serve(port: bell.ExecutorDoorbell, mapped, stop: threading.Event) -> None:
    """Answer each call with its input doubled; the slow layer's, and training calls, after
    SLOW_S."""
    seq = 0
    while not stop.is_set():
        if not port.rang():
            time.sleep(0.0005)
            continue
        seq += 1
        _, call_id, _, kind, _, _, layer, rows, cols, shm_in, shm_out, *_ = H.read_call(mapped, seq)
        x = torch.frombuffer(mapped, dtype=torch.float32, count=rows * cols, offset=shm_in)
        out = torch.frombuffer(mapped, dtype=torch.float32, count=rows * cols, offset=shm_out)
        out.copy_(2 * x)
        if layer == SLOW or kind == CallKind.TRAINING:
            time.sleep(SLOW_S)
        H.publish_reply(mapped, seq, call_id, H.OK, H.CODE_OF[torch.float32], 2, rows, cols)
        port.answer()


def test_each_layer_earns_its_own_watching(tmp_path) -> None:
    prefix = tmp_path / f"{bell.NAME_PREFIX}fast"
    worker = bell.WorkerDoorbell(prefix)
    executor = bell.ExecutorDoorbell(str(prefix), tmp_path, os.geteuid())
    worker.open()
    shm = ShmBuffer.create(1 << 16, tmp_path)
    layers = [LayerSpec(i, f"layer{i}", LayerKind.LINEAR, 8, 8, False) for i in (FAST, SLOW)]
    fast = FastPath(shm, worker, layers, torch.float32, spin_limit_s=LIMIT_S,
                    training_spin_limit_s=LIMIT_S)
    stop = threading.Event()
    server = threading.Thread(target=_serve, args=(executor, shm.raw, stop), daemon=True)
    server.start()
    try:
        x = torch.arange(8, dtype=torch.float32).view(1, 8)
        for call_id in range(1, 21):
            for layer in (FAST, SLOW):
                for kind in (CallKind.INFERENCE, CallKind.TRAINING):
                    y = fast.call(Op.FORWARD, layer, x + call_id, kind, call_id, lambda: None,
                                  None)
                    assert torch.equal(y, 2 * (x + call_id))
        inference, training = fast._spins[CallKind.INFERENCE], fast._spins[CallKind.TRAINING]
        assert inference[FAST].budget() == LIMIT_S
        assert inference[SLOW].budget() == 0.0
        assert training[FAST].budget() == training[SLOW].budget() == 0.0
    finally:
        stop.set()
        server.join()
        worker.close()
        executor.close()
        shm.close()


def test_training_calls_watch_less_by_default(tmp_path, monkeypatch) -> None:
    """A trainer's replies are long and its other threads want the cores: 0.2 ms against
    inference's 2 ms, each overridable from the environment."""
    monkeypatch.delenv("SYMBIOSIS_CLIENT_SPIN_US", raising=False)
    monkeypatch.delenv("SYMBIOSIS_CLIENT_TRAINING_SPIN_US", raising=False)
    layers = [LayerSpec(0, "layer0", LayerKind.LINEAR, 8, 8, False)]
    worker = bell.WorkerDoorbell(tmp_path / f"{bell.NAME_PREFIX}limits")
    shm = ShmBuffer.create(1 << 12, tmp_path)
    try:
        fast = FastPath(shm, worker, layers, torch.float32)
        assert fast._spins[CallKind.INFERENCE][0].budget() == 2000e-6
        assert fast._spins[CallKind.TRAINING][0].budget() == 200e-6
        monkeypatch.setenv("SYMBIOSIS_CLIENT_TRAINING_SPIN_US", "0")
        fast = FastPath(shm, worker, layers, torch.float32)
        assert fast._spins[CallKind.TRAINING][0].budget() == 0.0
    finally:
        worker.close()
        shm.close()
