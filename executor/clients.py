"""The workers the executor knows: their names and, on the same host, their shared memory."""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import zmq

from executor.ports import DoorbellPort
from wire.call import device as D
from wire.call import messages as P
from wire.call.cuda_ipc import (
    HANDLE_FIELDS,
    DeviceBuffer,
    ExecutorCounters,
    RefusedBuffer,
    open_buffer,
)
from wire.call.device import Driver
from wire.call.doorbell import ExecutorDoorbell
from wire.call.pinning import HostPins
from wire.call.shm import SHM_DIR, SegmentRefused, ShmBuffer

log = logging.getLogger("executor.clients")


@dataclass
class ClientState:
    identity: bytes
    name: str
    pid: int
    uid: int  # who may own its shared memory and doorbell (see `peer_uid`)
    shm: ShmBuffer | None = None
    doorbell: ExecutorDoorbell | None = None
    last_seen: float = field(default_factory=time.monotonic)
    port: DoorbellPort | None = None  # calls through shared memory and the doorbell
    device_buffer: DeviceBuffer | None = None  # the client's call buffer on a GPU (CUDA IPC)
    pins: HostPins | None = None  # on a GPU executor: rows through shared memory are pinned
    pinned: bool = False

    def __post_init__(self) -> None:
        self.remap(self.shm)

    def remap(self, shm: ShmBuffer | None) -> None:
        """New shared memory (it grew, or none any more): the doorbell port follows it."""
        if self.shm is not None and self.shm is not shm:
            self._unpin()
            self.shm.close()
        self.shm = shm
        self.port = DoorbellPort(shm, self.doorbell, self.device_buffer) \
            if shm and self.doorbell else None
        self._pin()

    def _pin(self) -> None:
        """Page-lock the shared memory while rows travel through it to a GPU (`wire.call.pinning`);
        a client whose rows are in its device buffer needs it pageable only."""
        if self.shm is None or self.pins is None:
            return
        if self.device_buffer is not None:
            self._unpin()
        elif not self.pinned:
            self.pinned = self.pins.pin(self.shm.bytes)

    def _unpin(self) -> None:
        if self.pinned and self.pins is not None and self.shm is not None:
            self.pins.retire(self.shm.bytes)
        self.pinned = False

    def share_device(self, message: P.ShareDevice, counters: ExecutorCounters | None,
                     driver: Driver | None) -> bool:
        """The client's call buffer on its GPU from now on; False (and the shared memory again)
        when refused or when the client withdrew it."""
        self.device_buffer = None
        if message.size and self.port is not None:
            fields = {f: getattr(message, f) for f in ("uuid", *HANDLE_FIELDS)}
            try:
                if driver is None or counters is None:
                    raise RefusedBuffer("this executor opens no device buffers (no GPU or no "
                                        "CUDA driver)")
                self.device_buffer = open_buffer(fields, message.token, counters, driver)
            except RefusedBuffer as exc:
                log.warning("device buffer of client %s refused (%s): shared memory", self.name,
                            exc)
        if self.port is not None:
            self.port.use(self.device_buffer)
        self._pin()
        return self.device_buffer is not None

    def release(self) -> None:
        if self.doorbell is not None:
            self.doorbell.close()
        self._unpin()
        if self.shm is not None:
            self.shm.close()
        self.device_buffer = None  # the IPC mapping closes with the last view of it
        if self.port is not None:
            self.port.use(None)


class ClientTable:
    """Written by the IO thread (hello, remap, bye); read by the compute loop."""

    def __init__(self, device: str = "cpu", driver: Driver | None = None) -> None:
        """`device`: the executor's; on a GPU, CPU clients' shared memory is pinned and GPU
        clients' call buffers are opened, both through the CUDA `driver` (default: the host's,
        loaded when first needed)."""
        self.device = torch.device(device)
        self._driver = driver
        self.pins = HostPins(self.device, driver) if D.is_gpu(self.device) else None
        self._clients: dict[bytes, ClientState] = {}
        self._lock = threading.Lock()
        self.generation = 0  # changes whenever a client comes or goes (doorbells to watch)
        self._counters: ExecutorCounters | None = None  # for clients' device buffers

    def share_device(self, client: ClientState, message: P.ShareDevice) -> bool:
        """Map (or, refused, forget) a client's call buffer on a GPU."""
        driver = self._gpu_driver()
        if driver is not None and self._counters is None:
            self._counters = ExecutorCounters()
        return client.share_device(message, self._counters, driver)

    def settle(self) -> None:
        """On the thread that runs batches: unpin the memory clients let go, once no copy to or
        from it can be in flight (`wire.call.pinning`)."""
        if self.pins is not None and self.pins.retiring:
            D.synchronize(self.device)
            self.pins.settle()

    def _gpu_driver(self) -> Driver | None:
        if not D.is_gpu(self.device):
            return None
        if self._driver is None:
            try:
                self._driver = Driver()
            except D.DeviceRefused as exc:
                log.warning("no CUDA driver for device buffers (%s)", exc)
                return None
        return self._driver

    def __len__(self) -> int:
        return len(self._clients)

    def get(self, identity: bytes) -> ClientState | None:
        return self._clients.get(identity)

    def add(self, state: ClientState) -> None:
        with self._lock:
            old = self._clients.pop(state.identity, None)
            self._clients[state.identity] = state
            self.generation += 1
        if old is not None:
            old.release()

    def admit(self, identity: bytes, hello: P.Hello, uid: int,
              directory: Path = SHM_DIR) -> ClientState:
        """A worker that said hello: its shared memory and doorbell when usable from here."""
        shm = self.map_shm(hello.shm_name, hello.shm_size, hello.shm_token, uid, directory)
        doorbell = None
        if shm is not None and hello.doorbell:
            try:
                doorbell = ExecutorDoorbell(hello.doorbell, directory, uid)
            except OSError as exc:
                log.info("doorbell %s not usable (%s): calls over the socket", hello.doorbell, exc)
        state = ClientState(identity, hello.client, hello.pid, uid, shm, doorbell,
                            pins=self.pins)
        self.add(state)
        memory = "no" if shm is None else "pinned" if state.pinned else "yes"
        log.info("client %s (pid %d) joined, shared memory: %s, doorbell: %s", hello.client,
                 hello.pid, memory, "yes" if doorbell else "no")
        return state

    def close(self) -> None:
        """Forget every client and unpin all their memory, once no batch runs any more. A table
        dropped with memory still pinned would leave its pages registered after they are
        unmapped: a later mapping at the same address is refused its pin (CUDA error 712), and
        copies to it land in the old pages (seen on an H200: results of zeros)."""
        for identity in list(self._clients):
            self.remove(identity)
        self.settle()

    def remove(self, identity: bytes) -> None:
        with self._lock:
            state = self._clients.pop(identity, None)
            self.generation += 1
        if state is not None:
            state.release()

    def drop_doorbell(self, identity: bytes) -> None:
        state = self._clients.get(identity)
        if state is not None and state.doorbell is not None:
            with self._lock:
                doorbell, state.doorbell, state.port = state.doorbell, None, None
                self.generation += 1
            doorbell.close()

    def with_doorbells(self) -> list[ClientState]:
        return [c for c in list(self._clients.values()) if c.doorbell is not None]

    def touch(self, identity: bytes) -> ClientState | None:
        state = self._clients.get(identity)
        if state is not None:
            state.last_seen = time.monotonic()
        return state

    def expire(self, idle_s: float) -> list[str]:
        """Forget clients silent for `idle_s`; a returning one is told to say hello again."""
        cutoff = time.monotonic() - idle_s
        stale = [c for c in list(self._clients.values()) if c.last_seen < cutoff]
        for client in stale:
            self.remove(client.identity)
        return [c.name for c in stale]

    @staticmethod
    def map_shm(name: str | None, size: int, token: bytes, uid: int,
                directory: Path = SHM_DIR) -> ShmBuffer | None:
        """Open a client's segment; None when it is not visible here (another host or namespace)
        or not one the client may have made (a path, a link, someone else's file)."""
        if not name:
            return None
        try:
            shm = ShmBuffer.attach(name, size, uid, directory)
        except SegmentRefused as exc:
            log.warning("shared memory refused (%s): socket frames instead", exc)
            return None
        except OSError as exc:
            log.info("shared memory %s not usable (%s): socket frames instead", name, exc)
            return None
        if not hmac.compare_digest(shm.read_token(), token):
            shm.close()
            log.warning("shared memory %s refused: wrong token", name)
            return None
        return shm


def peer_uid(frame: zmq.Frame, over_ipc: bool) -> int:
    """The uid that must own a client's shared memory: the peer's own, read from the kernel
    (SO_PEERCRED, which ZeroMQ reports as "host:uid:gid:pid") on an ipc:// socket; over TCP,
    where there is none, the executor's own (same-host TCP clients, as in compose, share its
    IPC namespace and run as its user)."""
    if over_ipc:
        with contextlib.suppress(zmq.ZMQError, ValueError, TypeError):
            return int(frame.get("Peer-Address").rsplit(":", 3)[1])
    return os.geteuid()
