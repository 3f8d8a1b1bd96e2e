"""Results written where they go: an op that can write its result into a doorbell client's
memory itself does so on a CPU executor (a lone call's linear layer, stretch, lead or greedy
step; several calls' joined parts when each call's result is large enough), and no result of a
GPU executor is (its results are on the device). Either way each client reads what the op
computes for its rows."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager

import pytest
import torch

from catalogue.resolve import resolve_model
from executor.calls import PendingCall
from executor.clients import ClientTable
from executor.engine import IN_PLACE_CALL_BYTES, Engine
from executor.registry import LayerRegistry
from executor.scheduler import Scheduler
from executor.stats import ExecutorStats
from wire.call import header as H
from wire.call import messages as P
from wire.call.doorbell import WorkerDoorbell
from wire.call.shm import SHM_DIR, ShmBuffer

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SHM_IN, SHM_OUT = H.DATA_AT, H.DATA_AT + (1 << 20)


def _same(device: str) -> dict:
    """The same op on the same rows: equal on the CPU; on a GPU within float32's tolerance."""
    return {"rtol": 0, "atol": 0} if device == "cpu" else {}


@contextmanager
def _client(table: ClientTable, identity: bytes, writes: list[int]) -> Iterator[ShmBuffer]:
    """A doorbell client admitted to `table`; its port's writes after a batch go to `writes`."""
    segment = ShmBuffer.create(4 << 20)
    doorbell = WorkerDoorbell.create_if_possible(SHM_DIR)
    assert doorbell is not None
    hello = P.Hello(identity.decode(), os.getpid(), shm_name=segment.name,
                    shm_size=segment.size, shm_token=segment.write_token(),
                    doorbell=str(doorbell.prefix))
    port = table.admit(identity, hello, os.geteuid()).port
    for name in ("write", "write_bytes"):
        real = getattr(port, name)
        setattr(port, name, lambda offset, y, real=real: (writes.append(offset), real(offset, y)))
    try:
        yield segment
    finally:
        table.remove(identity)
        doorbell.close()
        segment.close()
        segment.unlink()


def _call(segment: ShmBuffer, identity: bytes, seq: int, spec: P.LayerSpec, op: P.Op,
          x: torch.Tensor) -> PendingCall:
    view = segment.view(SHM_IN, x.dtype, tuple(x.shape))
    view.copy_(x)
    header = P.Call(seq, op, spec.index, P.CallKind.INFERENCE, "", (), SHM_IN, SHM_OUT)
    return PendingCall(identity, header, view, 0.0, reply_seq=seq)


def _result(segment: ShmBuffer, seq: int, rows: int, width: int) -> torch.Tensor:
    reply = H.read_reply(segment.raw, seq)
    assert reply is not None and reply[1] == H.OK and reply[4:6] == (rows, width)
    return segment.view(SHM_OUT, torch.float32, (rows, width))


@pytest.mark.parametrize("device", DEVICES)
def test_a_lone_call_writes_its_result_into_the_clients_memory_itself(device: str) -> None:
    """A stretch's, a lead's and a greedy call's last step joins parts, and a linear layer's
    product (forward and backward, `kernels.linear_into`) can be written where it goes."""
    registry = LayerRegistry.load(resolve_model("tiny-llama"), device=device)
    table = ClientTable(device)
    engine = Engine(registry, Scheduler(), table, ExecutorStats(), device)
    writes: list[int] = []
    kinds = (P.LayerKind.STRETCH, P.LayerKind.LEAD, P.LayerKind.GREEDY, P.LayerKind.LINEAR)
    calls = [(next(s for s in registry.specs if s.kind == kind), P.Op.FORWARD) for kind in kinds]
    calls.append((calls[-1][0], P.Op.BACKWARD))
    with closing(table), _client(table, b"identity", writes) as segment:
        for seq, (spec, op) in enumerate(calls, start=1):
            rows = 3
            width_in, width_out = (spec.out_features, spec.in_features) \
                if op == P.Op.BACKWARD else (spec.in_features, spec.out_features)
            x = torch.randint(0, 100, (rows,)) if spec.kind == P.LayerKind.LEAD \
                else torch.randn(rows, width_in)
            before = len(writes)
            assert engine.execute([_call(segment, b"identity", seq, spec, op, x)]) == []
            result = _result(segment, seq, rows, width_out)
            alone = registry.run(op, registry.get(spec.index), x.to(device)).cpu()
            torch.testing.assert_close(result, alone, **_same(device))
            if spec.kind == P.LayerKind.LINEAR:  # the product itself, not a near one
                w = registry.get(spec.index).weight.cpu()
                torch.testing.assert_close(result, x @ (w if op == P.Op.BACKWARD else w.t()))
            assert len(writes) - before == (0 if device == "cpu" else 1), (spec, op)


@pytest.mark.parametrize("device", DEVICES)
def test_several_calls_joined_parts_go_into_each_clients_memory_when_large(device: str) -> None:
    """A batch of three clients' calls of a stretch, a kept stretch (a training step's
    forward), a lead and a greedy step (several sequences' prompts, or their greedy steps, in
    one call each): from `IN_PLACE_CALL_BYTES` a call the op joins each call's rows into its memory
    (no write after, on the CPU); below it (a decode step's few rows) the batch's result is
    written to each after. Each client gets its rows of what the op gives the batch's rows."""
    registry = LayerRegistry.load(resolve_model("tiny-llama"), device=device)
    table = ClientTable(device)
    engine = Engine(registry, Scheduler(), table, ExecutorStats(), device)
    writes: list[int] = []
    kinds = (P.LayerKind.STRETCH, P.LayerKind.KEPT, P.LayerKind.LEAD, P.LayerKind.GREEDY)
    specs = [next(s for s in registry.specs if s.kind == kind) for kind in kinds]
    names = [b"a", b"b", b"c"]
    seq = 0
    with closing(table), ExitStack() as stack:
        segments = [stack.enter_context(_client(table, name, writes)) for name in names]
        for spec in specs:
            large = -(-IN_PLACE_CALL_BYTES // (4 * spec.out_features))  # rows of a large call
            for rows in ([large, large + 5, large], [1, large, 2]):
                seq += 1
                xs = [torch.randint(0, 100, (n,)) if spec.kind == P.LayerKind.LEAD
                      else torch.randn(n, spec.in_features) for n in rows]
                batch = [_call(segment, name, seq, spec, P.Op.FORWARD, x)
                         for segment, name, x in zip(segments, names, xs, strict=True)]
                before = len(writes)
                assert engine.execute(batch) == []
                whole = registry.run(P.Op.FORWARD, registry.get(spec.index),
                                     torch.cat(xs).to(device)).cpu()
                for segment, mine in zip(segments, whole.split(rows), strict=True):
                    torch.testing.assert_close(
                        _result(segment, seq, mine.shape[0], spec.out_features), mine,
                        **_same(device))
                # (a greedy step's one row, its logits with it, is large enough by itself)
                in_place = device == "cpu" and min(rows) >= large
                assert len(writes) - before == (0 if in_place else len(names)), (spec, rows)
