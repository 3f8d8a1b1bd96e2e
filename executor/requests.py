"""The executor's answers to the messages that come over its socket: calls (queued), hello,
remap, device buffers, pings, stats and goodbyes. A bad message raises CallRejected, which the
serving loop turns into an error reply to its sender alone."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import torch
import zmq

from executor.calls import PendingCall
from executor.clients import ClientState, ClientTable, peer_uid
from executor.config import ExecutorConfig
from executor.registry import LayerRegistry
from executor.scheduler import Scheduler
from executor.stats import ExecutorStats
from executor.validation import CallRejected, CallTable, check_call
from wire.call import messages as P
from wire.figures import ExecutorFigures

Send = Callable[[bytes, msgspec.Struct], None]
Tap = Callable[[str, P.Call, torch.Tensor], None]  # sees each call's input (tests, debugging)


class Requests:
    def __init__(self, registry: LayerRegistry, config: ExecutorConfig, scheduler: Scheduler,
                 clients: ClientTable, stats: ExecutorStats, table: CallTable, send: Send,
                 tap: Tap | None) -> None:
        self.registry = registry
        self.config = config
        self.scheduler = scheduler
        self.clients = clients
        self.stats = stats
        self.table = table
        self.send = send
        self.tap = tap
        self._over_ipc = config.bind.startswith("ipc://")

    def handle(self, identity: bytes, frames: list[zmq.Frame]) -> None:
        if not frames:
            raise CallRejected(-1, P.ErrorCode.BAD_MESSAGE, "empty message")
        try:
            message = P.decode_request(frames[0].buffer)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CallRejected(-1, P.ErrorCode.BAD_MESSAGE, f"undecodable header: {exc}") from None
        if isinstance(message, P.Call):
            self._queue(identity, message, frames)
        elif isinstance(message, P.Hello):
            self._hello(identity, message, peer_uid(frames[0], self._over_ipc))
        elif isinstance(message, P.Remap):
            client = self._known(identity, -1)
            client.remap(self.clients.map_shm(message.shm_name, message.shm_size,
                                              message.shm_token, client.uid))
            if client.shm is None:  # a doorbell call needs its header in shared memory
                self.clients.drop_doorbell(identity)
            self.send(identity, P.Mapped(client.shm is not None))
        elif isinstance(message, P.ShareDevice):
            client = self._known(identity, -1)
            self.send(identity, P.Mapped(self.clients.share_device(client, message)))
        elif isinstance(message, P.Ping):
            known = self.clients.touch(identity) is not None
            self.send(identity, P.Pong(self.registry.model_name, len(self.clients), known))
        elif isinstance(message, P.StatsRequest):
            self.send(identity, P.Stats(self._stats()))
        elif isinstance(message, P.Bye):
            self.forget(identity)

    def forget(self, identity: bytes) -> None:
        """A client that said goodbye or hung up its doorbell: out of the table, and no batch
        waits for it from now on (`Scheduler.depart`)."""
        self.clients.remove(identity)
        self.scheduler.depart(identity)

    def _stats(self) -> ExecutorFigures:
        self.stats.queue_depth = self.scheduler.depth()
        self.stats.clients = len(self.clients)
        return self.stats.snapshot()

    def _hello(self, identity: bytes, hello: P.Hello, uid: int) -> None:
        if hello.version != P.PROTOCOL_VERSION:
            raise CallRejected(-1, P.ErrorCode.BAD_MESSAGE,
                               f"protocol version {hello.version}, executor speaks "
                               f"{P.PROTOCOL_VERSION}")
        client = self.clients.admit(identity, hello, uid)
        self.send(identity, P.Welcome(self.registry.model_name, str(self.registry.dtype)[6:],
                                      self.registry.specs, client.shm is not None,
                                      doorbell=client.doorbell is not None,
                                      device=self.config.device,
                                      targets=self.scheduler.targets.carried()))

    def _known(self, identity: bytes, call_id: int) -> ClientState:
        client = self.clients.touch(identity)
        if client is None:
            raise CallRejected(call_id, P.ErrorCode.UNKNOWN_CLIENT, "say hello first")
        return client

    def _queue(self, identity: bytes, call: P.Call, frames: list[zmq.Frame]) -> None:
        client = self._known(identity, call.id)
        x = check_call(call, self.table, client.shm, frames[1:], self.registry.dtype)
        if self.tap is not None:
            self.tap(client.name, call, x.clone())
        self.scheduler.add(PendingCall(identity, call, x, self.scheduler.clock(),
                                       keepalive=frames))
