"""The compute loop on a real registry: a sliced training batch gives the same rows as one matmul,
and decode steps run between its slices."""

from __future__ import annotations

import torch

from catalogue.resolve import resolve_model
from executor.calls import PendingCall
from executor.clients import ClientTable
from executor.engine import Engine
from executor.policy import Budgets, Opportunistic
from executor.registry import LayerRegistry
from executor.scheduler import Scheduler
from executor.stats import ExecutorStats
from executor.targets import SliceTuner
from wire.call import messages as P
from wire.call.tensors import dtype_of, from_bytes


def _pending(s: Scheduler, client: str, op: P.Op, layer: int, kind: P.CallKind,
             x: torch.Tensor) -> PendingCall:
    call = PendingCall(client.encode(), P.Call(0, op, layer, kind, "float32", tuple(x.shape)), x,
                       s.clock())
    s.add(call)
    return call


def _rows(reply: list) -> torch.Tensor:
    header = P.decode_reply(reply[0])
    return from_bytes(reply[1], dtype_of(header.dtype), tuple(header.shape)).clone()


def test_sliced_training_batch_is_exact_and_lets_decode_steps_through() -> None:
    registry = LayerRegistry.load(resolve_model("tiny-llama"))
    scheduler = Scheduler(Opportunistic(Budgets(), tuner=SliceTuner(1e-9), min_slice_rows=64))
    engine = Engine(registry, scheduler, ClientTable(), ExecutorStats())
    linear = next(s for s in registry.specs if s.kind == P.LayerKind.LINEAR)
    torch.manual_seed(0)
    grad = torch.randn(200, linear.out_features)
    _pending(scheduler, "trainer", P.Op.BACKWARD, linear.index, P.CallKind.TRAINING, grad)
    training = scheduler.next_batch()
    step = torch.randn(1, linear.in_features)
    _pending(scheduler, "decoder", P.Op.FORWARD, linear.index, P.CallKind.INFERENCE, step)
    between: list[torch.Tensor] = []

    def run_decode_steps() -> None:
        scheduler.count_slice()
        while (batch := scheduler.between_slices()) is not None:
            between.extend(_rows(frames) for _, frames in engine.execute(batch))

    [(client, frames)] = engine.execute(training, between=run_decode_steps)
    weight = registry.get(linear.index).weight
    assert client == b"trainer"
    torch.testing.assert_close(_rows(frames), grad @ weight, rtol=0, atol=1e-5)
    assert len(between) == 1  # after the first of four slices
    torch.testing.assert_close(between[0], torch.nn.functional.linear(
        step, weight, registry.get(linear.index).bias), rtol=0, atol=1e-6)


def test_an_empty_call_gets_an_empty_result() -> None:
    registry = LayerRegistry.load(resolve_model("tiny-llama"))
    scheduler = Scheduler(Opportunistic(Budgets()))
    engine = Engine(registry, scheduler, ClientTable(), ExecutorStats())
    linear = next(s for s in registry.specs if s.kind == P.LayerKind.LINEAR)
    _pending(scheduler, "empty", P.Op.FORWARD, linear.index, P.CallKind.INFERENCE,
             torch.empty(0, linear.in_features))
    [(_, frames)] = engine.execute(scheduler.next_batch(), between=lambda: None)
    assert _rows(frames).shape == (0, linear.out_features)
