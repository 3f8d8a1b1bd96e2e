"""What runs between slices, on a real registry: after a training slice the ready decode steps,
then the ready prefills, each prefill itself in slices with the decode steps that come meanwhile
between them; every result the rows of one whole computation."""

from __future__ import annotations

import threading
import time

import torch

from catalogue.resolve import resolve_model
from executor.calls import PendingCall
from executor.clients import ClientTable
from executor.columns import MIN_DEPTH
from executor.engine import Engine
from executor.interleave import Interleave
from executor.policy import Budgets, Opportunistic
from executor.registry import LayerRegistry
from executor.scheduler import Scheduler
from executor.scheduling import macs_per_row
from executor.stats import ExecutorStats
from executor.targets import SliceTuner
from tests.executor.queued import Clock
from wire.call import messages as P
from wire.call.tensors import dtype_of, from_bytes

INFERENCE, TRAINING = P.CallKind.INFERENCE, P.CallKind.TRAINING


def _setup() -> tuple[LayerRegistry, Scheduler, Engine, Interleave, list]:
    """Slices as small as they come; the replies sent between slices land in the list."""
    registry = LayerRegistry.load(resolve_model("tiny-llama"))
    scheduler = Scheduler(Opportunistic(Budgets(), tuner=SliceTuner(1e-9)),
                          widths=dict(enumerate(macs_per_row(registry))))
    engine = Engine(registry, scheduler, ClientTable(), ExecutorStats())
    sent: list = []
    return registry, scheduler, engine, Interleave(scheduler, engine, sent.extend), sent


def _queue(s: Scheduler, client: str, index: int, kind: P.CallKind, x: torch.Tensor) -> None:
    s.add(PendingCall(client.encode(), P.Call(0, P.Op.FORWARD, index, kind, "float32",
                                              tuple(x.shape)), x, s.clock()))


def _rows(replies: list) -> dict[str, torch.Tensor]:
    out = {}
    for client, frames in replies:
        header = P.decode_reply(frames[0])
        out[client.decode()] = from_bytes(frames[1], dtype_of(header.dtype),
                                          tuple(header.shape)).clone()
    return out


def _stretch(registry: LayerRegistry):
    spec = next(s for s in registry.specs if s.kind == P.LayerKind.STRETCH)
    return spec, registry.get(spec.index).stretch


def test_a_prefill_runs_in_slices_with_a_decode_step_that_came_meanwhile_between() -> None:
    registry, scheduler, engine, interleave, sent = _setup()
    spec, stretch = _stretch(registry)
    torch.manual_seed(0)
    prompt, step = torch.randn(200, spec.in_features), torch.randn(1, spec.in_features)
    _queue(scheduler, "prefiller", spec.index, INFERENCE, prompt)
    prefill = scheduler.next_batch()
    _queue(scheduler, "decoder", spec.index, INFERENCE, step)  # arrives while it runs
    ran: list[int] = []
    whole = engine._runners[spec.index][P.Op.FORWARD]
    engine._runners[spec.index][P.Op.FORWARD] = lambda x: ran.append(x.shape[0]) or whole(x)
    got = _rows(engine.execute(prefill, between=interleave.between(prefill)))
    assert ran == [67, 1, 67, 66]  # three bands of rows (a stretch is no one matmul)
    assert list(_rows(sent)) == ["decoder"]  # answered between the first two
    torch.testing.assert_close(got["prefiller"], stretch(prompt), rtol=0, atol=1e-6)
    torch.testing.assert_close(_rows(sent)["decoder"], stretch(step), rtol=0, atol=1e-6)


def test_after_a_training_slice_decode_steps_run_then_prefills_then_training_goes_on() -> None:
    registry, scheduler, engine, interleave, sent = _setup()
    spec, stretch = _stretch(registry)
    group = next(s for s in registry.specs if s.kind == P.LayerKind.GROUP)
    weight = registry.get(group.index).weight
    torch.manual_seed(1)
    batch = torch.randn(200, group.in_features)
    prompt, step = torch.randn(150, spec.in_features), torch.randn(1, spec.in_features)
    scheduler.share.record(True, 1.0)  # training computed a second before: it has its share
    _queue(scheduler, "trainer", group.index, TRAINING, batch)
    training = scheduler.next_batch()
    _queue(scheduler, "prefiller", spec.index, INFERENCE, prompt)
    _queue(scheduler, "decoder", spec.index, INFERENCE, step)
    got = _rows(engine.execute(training, between=interleave.between(training)))
    assert [client.decode() for client, _ in sent] == ["decoder", "prefiller"]
    between = _rows(sent)
    torch.testing.assert_close(got["trainer"], batch @ weight.t(), rtol=0, atol=1e-5)
    torch.testing.assert_close(between["decoder"], stretch(step), rtol=0, atol=1e-6)
    torch.testing.assert_close(between["prefiller"], stretch(prompt), rtol=0, atol=1e-6)


def test_an_lm_heads_backward_runs_in_bands_of_its_sum_with_decode_steps_between() -> None:
    """64 output columns over a 50,259-deep sum: cut along the sum, not into one band."""
    registry, scheduler, engine, interleave, sent = _setup()
    spec, stretch = _stretch(registry)
    head = next(s for s in registry.specs if s.name == "lm_head")
    weight = registry.get(head.index).weight
    torch.manual_seed(2)
    grad, step = torch.randn(40, head.out_features), torch.randn(1, spec.in_features)
    scheduler.add(PendingCall(b"trainer", P.Call(0, P.Op.BACKWARD, head.index, TRAINING,
                                                 "float32", tuple(grad.shape)), grad,
                              scheduler.clock()))
    training = scheduler.next_batch()
    _queue(scheduler, "decoder", spec.index, INFERENCE, step)
    slices = []
    between = interleave.between(training)
    got = _rows(engine.execute(
        training, between=lambda seconds: slices.append(seconds) or between(seconds)))
    assert len(slices) + 1 == -(-head.out_features // MIN_DEPTH)  # bands of MIN_DEPTH
    assert list(_rows(sent)) == ["decoder"]  # answered after the first band
    torch.testing.assert_close(got["trainer"], grad @ weight, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(_rows(sent)["decoder"], stretch(step), rtol=0, atol=1e-6)


def test_a_training_batch_waits_between_slices_for_a_due_decode_step_and_answers_it() -> None:
    """A decoder calls 1 ms after each reply: while it is due, the batch waits between its
    slices; the step that comes runs there; once no step is due, the batch goes on."""
    registry = LayerRegistry.load(resolve_model("tiny-llama"))
    clock = Clock()
    scheduler = Scheduler(Opportunistic(Budgets(), tuner=SliceTuner(1e-9)), clock=clock,
                          widths=dict(enumerate(macs_per_row(registry))))
    engine = Engine(registry, scheduler, ClientTable(), ExecutorStats())
    sent: list = []
    handed: list = []  # before each wait, the other serving thread was let receive
    interleave = Interleave(scheduler, engine, sent.extend, lambda: handed.append(1))
    spec, _ = _stretch(registry)
    group = next(s for s in registry.specs if s.kind == P.LayerKind.GROUP)
    torch.manual_seed(3)
    batch, step = torch.randn(200, group.in_features), torch.randn(1, group.in_features)
    for _ in range(8):  # training has had its share of batches
        _queue(scheduler, "trainer", group.index, TRAINING, batch)
        scheduler.next_batch()
    _queue(scheduler, "trainer", group.index, TRAINING, batch)
    training = scheduler.next_batch()
    for index in (spec.index, group.index) * 3 + (spec.index,):  # meanwhile, a decoder's steps
        clock.advance(0.001)  # 1 ms after its reply
        _queue(scheduler, "decoder", index, INFERENCE, torch.zeros(1, 1))  # never run
        clock.advance(0.001)  # past its budget
        scheduler.observe(scheduler.next_batch(), 0.001)

    def decoder() -> None:  # comes at the group (real time) 50 ms later, then stops
        time.sleep(0.05)
        _queue(scheduler, "decoder", group.index, INFERENCE, step)
        deadline = time.monotonic() + 10
        while not sent and time.monotonic() < deadline:
            time.sleep(0.001)
        clock.advance(1.0)

    thread = threading.Thread(target=decoder)
    thread.start()
    got = _rows(engine.execute(training, between=interleave.between(training)))
    thread.join()
    weight = registry.get(group.index).weight
    assert list(_rows(sent)) == ["decoder"]  # answered between slices, not after the batch
    figures = engine.stats.snapshot()
    assert figures.training_holds >= 1 and figures.training_held_s >= 0.025  # most of the 50 ms
    assert len(handed) >= figures.training_holds
    torch.testing.assert_close(got["trainer"], batch @ weight.t(), rtol=0, atol=1e-5)
    torch.testing.assert_close(_rows(sent)["decoder"], step @ weight.t(), rtol=0, atol=1e-6)
