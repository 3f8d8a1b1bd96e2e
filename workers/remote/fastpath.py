"""A client's same-host fast path: its call header written in place in shared memory, the input
and result as typed views cached per layer, op and row count, the doorbell rung, and the reply
awaited by watching its header for a moment before sleeping on the doorbell pipe (for as long
as `AdaptiveSpin` says replies have lately taken, per layer and kind of call: in one decode step
a 64-wide q/k/v comes back in ~150 us, a 50k-vocab lm_head in ~1.5 ms, so one verdict for all
would make every call sleep, and a sleeping client costs the executor a wake-up, ~100 us on a
small VM, in the write that answers it). Training calls watch for a shorter time: their replies
are long, and a trainer's other threads and the executor want the cores meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from wire.call import header as H
from wire.call.cuda_ipc import DeviceBuffer
from wire.call.device import synchronize
from wire.call.doorbell import WorkerDoorbell
from wire.call.messages import NO_TARGETS, CallKind, CallTargets, LayerKind, LayerSpec, Op
from wire.call.shm import ShmBuffer
from wire.call.spin import AdaptiveSpin, watch
from wire.call.tensors import aligned, nbytes
from wire.call.threads import copy_threads
from wire.host import host
from workers.remote.parts import Parts


class NeedsCapacity(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class CallFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(slots=True)
class Plan:
    """Everything about a call that depends only on (layer, op, rows): views and header."""

    x: torch.Tensor
    out: torch.Tensor
    dtype_code: int
    ndim: int
    cols: int
    shm_in: int
    shm_out: int


class FastPath:
    def __init__(self, shm: ShmBuffer, doorbell: WorkerDoorbell, layers: list[LayerSpec],
                 dtype: torch.dtype, heartbeat_s: float = 2.0,
                 spin_limit_s: float | None = None,
                 training_spin_limit_s: float | None = None) -> None:
        self.shm = shm
        self.heartbeat_s = heartbeat_s
        self.doorbell = doorbell
        self.mapped = shm.raw
        self.dtype = dtype
        self.seq = 0
        settings = host()
        limits = {CallKind.INFERENCE: _limit(spin_limit_s, settings.client_spin_us),
                  CallKind.TRAINING: _limit(training_spin_limit_s,
                                            settings.client_training_spin_us)}
        self._spins = {kind: [AdaptiveSpin(limit) for _ in layers]
                       for kind, limit in limits.items()}
        self._widths = [_widths(spec) for spec in layers]
        self._plans: dict[tuple[int, int, int, torch.dtype], Plan] = {}
        self.data: ShmBuffer | DeviceBuffer = shm  # where calls' tensors go

    def remap(self, shm: ShmBuffer) -> None:
        """Fresh memory: the executor's port starts counting calls anew, and so do we."""
        on_device = isinstance(self.data, DeviceBuffer)
        self.shm, self.mapped, self.seq = shm, shm.raw, 0
        self.data = self.data if on_device else shm
        self._plans.clear()

    def use(self, device_buffer: DeviceBuffer | None) -> None:
        """Tensors in a buffer on this process's GPU (None: in the shared memory again)."""
        self.data = device_buffer if device_buffer is not None else self.shm
        self._plans.clear()

    def call(self, op: int, layer: int, x: torch.Tensor | Parts, kind: int, call_id: int,
             check_alive: Callable[[], None], deadline: float | None,
             targets: CallTargets = NO_TARGETS, marks: int = 0) -> torch.Tensor:
        """The result, a view of shared memory (or of the device buffer) valid until the next
        call. `marks`: a decode step's call, a flex one's (`wire.call.header.DECODE`, `FLEX`).
        `x` in `Parts`: each copied into its columns of the call's memory."""
        key = (layer, op, x.shape[0], x.dtype)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(layer, op, x)
        if isinstance(x, Parts):
            x.copy_into(plan.x)
        else:
            with copy_threads(x):
                plan.x.copy_(x)
        synchronize(plan.x.device)  # on a GPU the executor reads it from another process
        self.seq += 1
        seq = self.seq
        H.publish_call(self.mapped, seq, call_id, op, kind, plan.dtype_code, plan.ndim, layer,
                       x.shape[0], plan.cols, plan.shm_in, plan.shm_out, targets.decode_us,
                       targets.prefill_us, marks)
        self.doorbell.ring()
        reply = self._await(seq, check_alive, deadline, self._spins[kind][layer])
        if reply[1] != H.OK:
            code, message = H.read_error(self.mapped, reply[1], reply[6])
            raise CallFailed(code, message)
        return plan.out

    def _plan(self, layer: int, op: int, x: torch.Tensor | Parts) -> Plan:
        width = self._widths[layer].get(op)
        if width is None:
            raise CallFailed("unsupported", f"layer {layer} does not take op {op}")
        floating = x.is_floating_point()
        dtype = self.dtype if floating else torch.int64
        shape = tuple(x.shape)
        rows, cols = shape[0], (shape[1] if len(shape) == 2 else 0)
        shm_in = H.DATA_AT
        shm_out = shm_in + aligned(nbytes(dtype, shape))
        needed = shm_out + nbytes(self.dtype, (rows, width))
        if needed > self.data.size:
            raise NeedsCapacity(needed)
        if len(self._plans) > 512:  # prefill lengths vary: keep the cache bounded
            self._plans.clear()
        plan = Plan(self.data.view(shm_in, dtype, shape),
                    self.data.view(shm_out, self.dtype, (rows, width)), H.CODE_OF[dtype],
                    len(shape), cols, shm_in, shm_out)
        self._plans[(layer, op, rows, x.dtype)] = plan
        return plan

    def _await(self, seq: int, check_alive: Callable[[], None], deadline: float | None,
               spin: AdaptiveSpin | None = None) -> tuple:
        """The reply to call `seq`: watch its header for the spin budget, then sleep on the
        doorbell, pinging the executor over the socket whenever it stays silent."""
        mapped, read = self.mapped, H.read_reply
        started = time.perf_counter()
        budget = spin.budget() if spin is not None and H.SPIN_SAFE else 0.0
        reply = watch(lambda: read(mapped, seq), budget) if budget else None
        while True:
            reply = reply or read(mapped, seq)
            if reply is not None:
                if spin is not None:
                    spin.observe(time.perf_counter() - started)
                return reply
            wait = self.heartbeat_s if deadline is None else \
                min(self.heartbeat_s, deadline - time.monotonic())
            if wait <= 0:
                raise TimeoutError
            if not self.doorbell.wait(wait):
                check_alive()


def _limit(given: float | None, configured_us: float) -> float:
    return given if given is not None else configured_us / 1e6


def _widths(spec: LayerSpec) -> dict[int, int]:
    if spec.kind in (LayerKind.EMBEDDING, LayerKind.LEAD, LayerKind.GREEDY, LayerKind.LOSS):
        return {Op.FORWARD: spec.out_features}
    if spec.kind in (LayerKind.STRETCH, LayerKind.KEPT):
        return {Op.FORWARD: spec.out_features, Op.BACKWARD: spec.in_features}
    return {Op.FORWARD: spec.out_features, Op.FORWARD_NOBIAS: spec.out_features,
            Op.BACKWARD: spec.in_features}
