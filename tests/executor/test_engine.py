"""The compute loop on a real registry: a sliced training batch gives the same rows as one matmul
(cut into bands of columns where it is one, of rows elsewhere), and decode steps run between its
slices. Each on the CPU and (gpu-marked) on a CUDA executor: its bands keep the process's threads.
Results written into a client's memory by the op itself: test_in_place.py."""

from __future__ import annotations

import pytest
import torch

from catalogue.resolve import resolve_model
from executor.calls import PendingCall
from executor.clients import ClientTable
from executor.columns import Columns
from executor.engine import Engine
from executor.policy import Budgets, Opportunistic
from executor.registry import LayerRegistry
from executor.scheduler import Scheduler
from executor.scheduling import macs_per_row
from executor.stats import ExecutorStats
from executor.targets import SliceTuner
from wire.call import messages as P
from wire.call.tensors import dtype_of, from_bytes

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _exact(device: str) -> dict:
    """Tolerances against one matmul on the CPU: a CUDA kernel for a band may sum in another
    order than the one for the whole."""
    return {"rtol": 0, "atol": 1e-6} if device == "cpu" else {}


def _pending(s: Scheduler, client: str, op: P.Op, layer: int, kind: P.CallKind,
             x: torch.Tensor) -> PendingCall:
    call = PendingCall(client.encode(), P.Call(0, op, layer, kind, "float32", tuple(x.shape)), x,
                       s.clock())
    s.add(call)
    return call


def _rows(reply: list) -> torch.Tensor:
    header = P.decode_reply(reply[0])
    return from_bytes(reply[1], dtype_of(header.dtype), tuple(header.shape)).clone()


def _slicing(registry: LayerRegistry, device: str = "cpu") -> tuple[Scheduler, Engine]:
    """An engine whose training batches run in slices as small as they come."""
    scheduler = Scheduler(Opportunistic(Budgets(), tuner=SliceTuner(1e-9)),
                          widths=dict(enumerate(macs_per_row(registry))))
    return scheduler, Engine(registry, scheduler, ClientTable(device), ExecutorStats(), device)


def _train_beside_a_decode_step(scheduler: Scheduler, engine: Engine, op: P.Op, index: int,
                                x: torch.Tensor, step: torch.Tensor
                                ) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    """A training batch of `x` with a decode step of `step` queued: (its result, what the decode
    steps got between its slices, how many gaps there were)."""
    _pending(scheduler, "trainer", op, index, P.CallKind.TRAINING, x)
    training = scheduler.next_batch()
    _pending(scheduler, "decoder", P.Op.FORWARD, index, P.CallKind.INFERENCE, step)
    between: list[torch.Tensor] = []
    gaps = 0

    def run_decode_steps(seconds: float) -> None:
        nonlocal gaps
        assert seconds > 0  # the slice's own compute
        gaps += 1
        scheduler.count_slice(seconds)
        while (batch := scheduler.between_slices()) is not None:
            between.extend(_rows(frames) for _, frames in engine.execute(batch))

    [(client, frames)] = engine.execute(training, between=run_decode_steps)
    assert client == b"trainer"
    return _rows(frames), between, gaps


@pytest.mark.parametrize("device", DEVICES)
def test_a_training_matmul_runs_in_bands_of_columns_equal_to_the_whole(device: str) -> None:
    """On a CPU each band runs on one thread (beside inference workers a second one stalls it);
    on a GPU the process's threads stay as they are."""
    registry = LayerRegistry.load(resolve_model("tiny-llama"), device=device)
    scheduler, engine = _slicing(registry, device)
    group = next(s for s in registry.specs if s.kind == P.LayerKind.GROUP and s.out_features
                 == 256)  # gate and up: 4 bands of 64 columns
    weight = registry.get(group.index).weight
    host_weight = weight.cpu()
    threads_during: list[int] = []

    class Watched(Columns):
        def run(self, x, band, out, inner=False) -> None:
            threads_during.append(torch.get_num_threads())
            super().run(x, band, out, inner)

    engine._columns[group.index][P.Op.FORWARD] = Watched(weight)
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x, step = torch.randn(200, group.in_features), torch.randn(1, group.in_features)
        y, between, gaps = _train_beside_a_decode_step(scheduler, engine, P.Op.FORWARD,
                                                       group.index, x, step)
        assert torch.get_num_threads() == 2  # each band ran on one thread, then back
    finally:
        torch.set_num_threads(threads)
    assert gaps == 3 and threads_during == [1 if device == "cpu" else 2] * 4
    torch.testing.assert_close(y, torch.mm(x, host_weight.t()), **_exact(device))
    assert len(between) == 1  # after the first band
    torch.testing.assert_close(between[0], step @ host_weight.t(), **_exact(device))
    down = next(s for s in registry.specs if s.name.endswith("0.mlp.down_proj"))
    grad = torch.randn(200, down.out_features)  # backward: bands of its 128 input columns
    y, _, gaps = _train_beside_a_decode_step(*_slicing(registry, device), P.Op.BACKWARD,
                                             down.index, grad, torch.randn(1, down.in_features))
    assert gaps == 1
    torch.testing.assert_close(y, torch.mm(grad, registry.get(down.index).weight.cpu()),
                               **_exact(device))


@pytest.mark.parametrize("device", DEVICES)
def test_a_training_op_that_is_no_single_matmul_runs_in_bands_of_rows(device: str) -> None:
    """A stretch's backward (what a GPU trainer's layers call) in bands of rows."""
    registry = LayerRegistry.load(resolve_model("tiny-llama"), device=device)
    scheduler, engine = _slicing(registry, device)
    spec = next(s for s in registry.specs if s.kind == P.LayerKind.STRETCH)
    stretch = registry.get(spec.index).stretch
    torch.manual_seed(0)
    # [inputs | residual output | output gradients]
    x = torch.randn(200, spec.in_features + spec.splits[0] + spec.out_features)
    step = torch.randn(1, spec.in_features)
    y, between, gaps = _train_beside_a_decode_step(scheduler, engine, P.Op.BACKWARD, spec.index,
                                                   x, step)
    assert gaps == 2  # 200 rows: 67, 67, 66
    whole = stretch.backward(x.to(device)).cpu()
    torch.testing.assert_close(y, whole, **_exact(device))
    torch.testing.assert_close(between[0], stretch(step.to(device)).cpu(), **_exact(device))


@pytest.mark.parametrize("device", DEVICES)
def test_an_empty_call_gets_an_empty_result(device: str) -> None:
    registry = LayerRegistry.load(resolve_model("tiny-llama"), device=device)
    scheduler = Scheduler(Opportunistic(Budgets()))
    engine = Engine(registry, scheduler, ClientTable(device), ExecutorStats(), device)
    linear = next(s for s in registry.specs if s.kind == P.LayerKind.LINEAR)
    _pending(scheduler, "empty", P.Op.FORWARD, linear.index, P.CallKind.INFERENCE,
             torch.empty(0, linear.in_features))
    [(_, frames)] = engine.execute(scheduler.next_batch(), between=lambda: None)
    assert _rows(frames).shape == (0, linear.out_features)
