"""A worker's connection to the executor: a DEALER socket, a shared-memory buffer and, on the
same host, a doorbell.

One call in flight at a time (a lock enforces it). On the same host, inputs and results travel
through shared memory that grows on demand, and the call header goes next to them in a fixed
binary layout with one byte through the doorbell pipe (`FastPath`); without a doorbell the header
crosses the socket, and across hosts the tensors travel as raw frames. While waiting, the client
pings the executor: a dead executor raises ExecutorUnavailable within seconds, and a restarted
one (which no longer knows this worker) gets a fresh hello and the call again, transparently.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import torch
import zmq

from wire.call import doorbell as bell
from wire.call import messages as P
from wire.call.cuda_ipc import DeviceBuffer
from wire.call.device import DeviceRefused
from wire.call.shm import SHM_DIR, ShmBuffer
from wire.call.tensors import aligned, as_bytes, dtype_of, from_bytes, name_of, nbytes
from wire.figures import ExecutorFigures
from wire.host import host
from workers.remote.channel import Channel, Reconnect
from workers.remote.fastpath import CallFailed, FastPath, NeedsCapacity
from workers.remote.handle import ExecutorError, ExecutorUnavailable, decoding, flexing, marks
from workers.remote.parts import Input, Parts
from workers.remote.replicas import Replicas
from workers.remote.transport import Transport, choose

log = logging.getLogger("workers.remote.client")
SHM_INITIAL = 1 << 20


class ExecutorClient:
    takes_parts = True  # `call` takes an input in `Parts` (copied into the call's memory)

    def __init__(self, endpoint: str, *, name: str = "worker", use_shm: bool = True,
                 use_doorbell: bool = True, connect_timeout_s: float = 10.0,
                 heartbeat_s: float = 2.0, call_timeout_s: float | None = None,
                 curve_server_key: str | None = None, device: str = "cpu",
                 background: bool = False) -> None:
        """`background` (a trainer's): every call goes as a training call, no-grad ones too."""
        self.replicas = Replicas(endpoint, name)
        self.background = background
        self.client_device = torch.device(device)  # where this process's tensors live
        self.transport = Transport.FRAMES
        self.name = name
        self.use_shm = use_shm
        self.use_doorbell = use_shm and use_doorbell
        self.connect_timeout_s = connect_timeout_s
        self.heartbeat_s = heartbeat_s
        self.call_timeout_s = call_timeout_s
        self.curve_server_key = curve_server_key or host().executor_curve_public or None
        self._ctx = zmq.Context()
        self._lock = threading.Lock()
        self._channel: Channel | None = None
        self._shm: ShmBuffer | None = None
        self._doorbell: bell.WorkerDoorbell | None = None
        self._fast: FastPath | None = None
        self._next_id = 0
        self.calls = 0
        # what the next calls' tenants ask of their waits (an inference worker sets it per step)
        self.targets: P.CallTargets = P.NO_TARGETS
        self._connect()

    # -- public -------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return self.replicas.current

    def call(self, op: P.Op, layer: int, x: Input, kind: P.CallKind) -> torch.Tensor:
        kind = P.CallKind.TRAINING if self.background else kind
        with self._lock:
            for tried in range(1, len(self.replicas) + 1):
                try:
                    return self._call_replica(op, layer, x, kind)
                except ExecutorUnavailable:
                    if tried == len(self.replicas):
                        raise
                    gone = self.endpoint
                    log.warning("executor %s is unavailable: moving to %s", gone,
                                self.replicas.move())
            raise AssertionError("unreachable")

    def _call_replica(self, op: P.Op, layer: int, x: Input, kind: P.CallKind) -> torch.Tensor:
        if self._channel is None:
            self._connect()
        for attempt in range(2):
            try:
                return self._call(op, layer, x, kind)
            except Reconnect:
                if attempt:
                    raise ExecutorUnavailable("executor keeps forgetting this worker") from None
                log.info("executor restarted: saying hello again")
                self._reset()
                self._connect()
            except ExecutorUnavailable:
                self._reset()  # a late reply must not land in the next call's buffer
                raise
        raise AssertionError("unreachable")

    def stats(self) -> ExecutorFigures:
        with self._lock:
            if self._channel is None:
                self._connect()
            return self._channel.request(P.StatsRequest(), P.Stats, self.connect_timeout_s).figures

    def __del__(self) -> None:  # never leave a context that blocks interpreter exit
        try:
            self._reset()
            self._ctx.term()
        except Exception:
            pass

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close(goodbye=True)
                self._channel = None
            self._reset()
            self._ctx.term()

    # -- connection ---------------------------------------------------------------------------

    def _connect(self) -> None:
        self._channel = Channel(self._ctx, self.endpoint, self.name, self.heartbeat_s,
                                self.curve_server_key)
        hello = P.Hello(self.name, os.getpid())
        if self.use_shm and self._shm is None:
            self._shm = ShmBuffer.create(SHM_INITIAL)
        if self._shm is not None:
            hello.shm_name, hello.shm_size = self._shm.name, self._shm.size
            hello.shm_token = self._shm.write_token()
            self._doorbell = bell.WorkerDoorbell.create_if_possible(SHM_DIR) if self.use_doorbell \
                else None
            hello.doorbell = str(self._doorbell.prefix) if self._doorbell else None
        try:
            welcome = self._channel.request(hello, P.Welcome, self.connect_timeout_s, ping=False)
        except ExecutorError:
            self._reset()
            raise
        if self._shm is not None:
            self._shm.unlink()  # both sides hold the mapping now; nothing is left to clean up
            if not welcome.shm:
                self._shm.close()
                self._shm = None
        self.model: str = welcome.model
        self.dtype: torch.dtype = dtype_of(welcome.dtype)
        self.layers: list[P.LayerSpec] = welcome.layers
        if not self.replicas.check([spec.name for spec in welcome.layers]):
            self._reset()
            raise ExecutorError(P.ErrorCode.INTERNAL, f"executor {self.endpoint} offers other "
                                "layers than the replica this client started on")
        self.device, self.own_targets = welcome.device, welcome.targets  # its own waits a lane
        if self._doorbell is not None:
            if welcome.doorbell:
                self._doorbell.open()
                self._fast = FastPath(self._shm, self._doorbell, self.layers, self.dtype,
                                      self.heartbeat_s)
            else:
                self._doorbell.close()
                self._doorbell = None
        self.transport = choose(str(self.client_device), welcome.device,
                                self._shm is not None, self._fast is not None)
        if self.transport == Transport.DEVICE and not self._share_device(SHM_INITIAL):
            self.transport = Transport.SHARED_MEMORY

    def _share_device(self, size: int) -> bool:
        """A call buffer of `size` bytes on this process's GPU for the executor to use; False
        (calls through shared memory) when it cannot be shared or the executor refuses it."""
        try:
            buffer = DeviceBuffer(size, self.client_device)
            fields, token = buffer.export()
            share = P.ShareDevice(token=token, **fields)
        except (DeviceRefused, RuntimeError) as exc:  # no IPC for this allocation here
            log.warning("no device buffer (%s): calls through shared memory", exc)
            buffer, share = None, P.ShareDevice("", b"", 0, 0, b"", False, b"")  # forget one
        try:
            ok = self._channel.request(share, P.Mapped, self.connect_timeout_s).ok
        except ExecutorError as exc:
            if isinstance(exc, ExecutorUnavailable):
                raise
            log.warning("the executor refused the device buffer (%s)", exc)
            ok = False
        ok = buffer is not None and ok
        self._fast.use(buffer if ok else None)
        return ok

    @property
    def doorbell(self) -> bool:
        return self._doorbell is not None

    def _reset(self) -> None:
        self._fast = None
        if self._doorbell is not None:
            self._doorbell.close()
            self._doorbell = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._shm is not None:
            self._shm.unlink()  # a no-op once the executor mapped it; else the file would stay
            self._shm.close()
            self._shm = None

    def _ensure_capacity(self, needed: int) -> None:
        if self.transport == Transport.DEVICE:
            if self._share_device(max(needed, 2 * self._fast.data.size)):
                return
            self.transport = Transport.SHARED_MEMORY
        if self._shm is None or needed <= self._shm.size:
            return
        size = max(needed, 2 * self._shm.size)
        shm = ShmBuffer.create(size)
        token = shm.write_token()
        try:
            mapped = self._channel.request(P.Remap(shm.name, size, token), P.Mapped,
                                           self.connect_timeout_s)
        finally:
            shm.unlink()
        self._shm.close()
        self._shm = shm if mapped.ok else None
        if mapped.ok:
            if self._fast is not None:
                self._fast.remap(shm)
        else:
            shm.close()
            self._fast = None
            if self._doorbell is not None:  # the executor dropped it too: socket calls from now
                self._doorbell.close()
                self._doorbell = None

    # -- calls ------------------------------------------------------------------------------------

    def _call(self, op: P.Op, layer: int, x: Input, kind: P.CallKind) -> torch.Tensor:
        self._next_id += 1
        self.calls += 1
        if self._fast is not None:
            return self._call_fast(op, layer, x, kind)
        x = x.joined() if isinstance(x, Parts) else x
        spec, floating = self.layers[layer], x.is_floating_point()
        wire_dtype = self.dtype if floating else torch.int64
        width = spec.in_features if floating and op == P.Op.BACKWARD else spec.out_features
        in_bytes = nbytes(wire_dtype, tuple(x.shape))
        out_bytes = nbytes(self.dtype, (x.shape[0], width))
        targets = self.targets
        call = P.Call(self._next_id, op, layer, kind, name_of(wire_dtype), tuple(x.shape),
                      decode_target_us=targets.decode_us, prefill_target_us=targets.prefill_us,
                      decode=decoding(), flex=flexing())
        self._ensure_capacity(aligned(in_bytes) + out_bytes)
        if self._shm is not None:
            call.shm_in, call.shm_out = 0, aligned(in_bytes)
            self._shm.view(0, wire_dtype, tuple(x.shape)).copy_(x)
            self._channel.send([P.encode(call)])
        else:
            self._channel.send([P.encode(call), as_bytes(x.to(wire_dtype))])
        reply, frames = self._channel.wait(lambda m: getattr(m, "id", None) in (call.id, -1),
                                           self.call_timeout_s)
        if isinstance(reply, P.Error):
            if reply.code == P.ErrorCode.UNKNOWN_CLIENT:
                raise Reconnect
            if reply.code == P.ErrorCode.UNAVAILABLE:
                raise ExecutorUnavailable(reply.message)
            raise ExecutorError(reply.code, reply.message)
        dtype = dtype_of(reply.dtype)
        if reply.shm:
            return self._shm.view(call.shm_out, dtype, reply.shape)
        return from_bytes(frames[0].buffer, dtype, reply.shape)

    def _call_fast(self, op: P.Op, layer: int, x: Input, kind: P.CallKind) -> torch.Tensor:
        deadline = None if self.call_timeout_s is None else time.monotonic() + self.call_timeout_s
        args = (op, layer, x, kind, self._next_id, self._channel.check_alive, deadline,
                self.targets, marks())
        try:
            return self._fast.call(*args)
        except NeedsCapacity as needed:
            self._ensure_capacity(needed.size)
            if self._fast is None:  # the executor could not map the larger memory
                return self._call(op, layer, x, kind)
            return self._fast.call(*args)
        except CallFailed as failed:
            if failed.code == P.ErrorCode.UNKNOWN_CLIENT:
                raise Reconnect from None
            if failed.code == P.ErrorCode.UNAVAILABLE:
                raise ExecutorUnavailable(failed.message) from None
            raise ExecutorError(failed.code, failed.message) from None
        except bell.Hangup:
            self._channel.check_alive()
            raise ExecutorUnavailable(f"executor at {self.endpoint} dropped this worker") from None
        except TimeoutError:
            raise ExecutorUnavailable(f"no reply from {self.endpoint} in "
                                      f"{self.call_timeout_s} s") from None
