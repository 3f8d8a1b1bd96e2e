"""The gateway's async connection to the worker manager: send requests, demultiplex replies.

One DEALER socket, used without pyzmq's asyncio layer (a future and its callbacks for every
message): a message is sent at once (no send limit, as the manager's own sockets), and a reader
task, woken through the event loop by the socket's descriptor, routes every reply already arrived to
the inbox of its request id (`gateway.inbox`; an API request's prompts share one). That descriptor
signals only a change of the socket's state, which any operation on the socket may consume, so after
each send the state is read again and the reader woken where replies wait (else a reply that came
during a send would wait for the next one to arrive). A heartbeat task asks the manager for its
status every second (`heartbeat_s`); when the manager has not answered for a while, requests fail at
once with 503 instead of waiting out a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgspec
import zmq

from gateway.inbox import Inbox
from wire import manager as W
from wire.jobs import JobCommand, JobState
from wire.store import StoreAnswer, StoreCommand

log = logging.getLogger("gateway.manager")
DRAIN = 256  # replies routed in one go (the frame that passes it routed whole)


class ManagerUnavailable(Exception):
    pass


class ManagerClient:
    def __init__(self, endpoint: str, *, stale_s: float = 10.0, heartbeat_s: float = 1.0) -> None:
        self.endpoint = endpoint
        self.stale_s = stale_s
        self.heartbeat_s = heartbeat_s
        self.status: W.StatusReply | None = None
        self.last_seen = 0.0
        self._ctx = zmq.Context()
        self._readable = asyncio.Event()  # replies may wait in the socket
        self._inboxes: dict[str, Inbox] = {}
        self._status_waiters: list[asyncio.Future] = []
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)
        self._sock.connect(self.endpoint)
        asyncio.get_running_loop().add_reader(self._sock.FD, self._readable.set)
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._heartbeat())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        asyncio.get_running_loop().remove_reader(self._sock.FD)
        self._sock.close(0)
        self._ctx.term()

    @property
    def up(self) -> bool:
        return time.monotonic() - self.last_seen < self.stale_s

    def open(self, requests: list[W.Generate]) -> Inbox:
        """Send every request at once, in one frame; the replies to all of them wait in the one
        inbox returned (in the order they come), each id's until `forget` or `abort` lets it
        go."""
        if not self.up:
            raise ManagerUnavailable("the worker manager is not reachable")
        inbox = Inbox()
        for request in requests:
            self._inboxes[request.id] = inbox
        if requests:
            self._sock.send(W.encode(W.framed(requests)), zmq.NOBLOCK)
        self._wake_if_waiting()
        return inbox

    def forget(self, request_id: str) -> None:
        """Replies to `request_id` are dropped from now on (its request has ended)."""
        self._inboxes.pop(request_id, None)

    async def next(self, inbox: Inbox, timeout_s: float) -> W.Message | None:
        """The next reply in `inbox`, or None after `timeout_s` or as soon as the manager goes
        silent (one waiting already is returned even when `timeout_s` has run out)."""
        deadline = time.monotonic() + timeout_s
        while True:
            event = await inbox.get(min(max(deadline - time.monotonic(), 0.0), 1.0))
            if event is not None:
                return event
            if not self.up or time.monotonic() >= deadline:
                return None

    async def abort(self, request_ids: list[str]) -> None:
        """Tell the manager to stop requests, in one message; their replies are dropped from
        now on."""
        for request_id in request_ids:
            self.forget(request_id)
        with contextlib.suppress(zmq.ZMQError):
            await self._post(W.encode(W.Abort(request_ids)))

    async def send(self, message: msgspec.Struct) -> None:
        await self._post(W.encode(message))

    async def job(self, command: JobCommand, timeout_s: float) -> JobState | None:
        """Ask the manager to act on a job; its answer once the action took effect (a running
        job's pause or cancel: once its trainer stopped), or None after `timeout_s`."""
        return await self._ask(command, JobState, timeout_s)

    async def store(self, command: StoreCommand, timeout_s: float) -> StoreAnswer | None:
        """Ask the manager to change a record (`wire.store`); its answer once done or refused,
        or None after `timeout_s`."""
        return await self._ask(command, StoreAnswer, timeout_s)

    async def _ask(self, command: JobCommand | StoreCommand, answer_type: type,
                   timeout_s: float):
        if not self.up:
            raise ManagerUnavailable("the worker manager is not reachable")
        inbox = self._inboxes[command.id] = Inbox()
        try:
            await self._post(W.encode(command))
            answer = await self.next(inbox, timeout_s)
        except zmq.ZMQError:
            return None
        finally:
            self._inboxes.pop(command.id, None)
        return answer if isinstance(answer, answer_type) else None

    async def fresh_status(self, timeout_s: float = 2.0) -> W.StatusReply | None:
        future = asyncio.get_running_loop().create_future()
        self._status_waiters.append(future)
        await self._post(W.encode(W.Status()))
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            return None
        finally:
            with contextlib.suppress(ValueError):
                self._status_waiters.remove(future)

    async def _post(self, data: bytes) -> None:
        """Send `data` (at once: the socket has no send limit), then wake the reader where
        replies wait: the send may have taken the descriptor's signal of their coming."""
        self._sock.send(data, zmq.NOBLOCK)
        self._wake_if_waiting()

    def _wake_if_waiting(self) -> None:
        if self._sock.get(zmq.EVENTS) & zmq.POLLIN:
            self._readable.set()

    async def _read(self) -> None:
        """Route the replies waiting at each wake-up, `DRAIN` at most before the event loop's
        other work (then on, still woken)."""
        while True:
            await self._readable.wait()
            self._readable.clear()
            routed = 0
            while routed < DRAIN:
                try:
                    data = self._sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                routed += self._route(data)
            else:  # more may wait: on after the others' turn
                self._readable.set()
                await asyncio.sleep(0)

    def _route(self, data: bytes) -> int:
        """The frame's replies each to its inbox; how many it held."""
        try:
            message = W.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("undecodable message from the manager")
            return 1
        self.last_seen = time.monotonic()
        if isinstance(message, W.StatusReply):
            self.status = message
            for future in self._status_waiters:
                if not future.done():
                    future.set_result(message)
            self._status_waiters.clear()
            return 1
        replies = W.unframed(message)
        for reply in replies:
            inbox = self._inboxes.get(getattr(reply, "id", ""))
            if inbox is not None:
                inbox.put(reply)
        return len(replies)

    async def _heartbeat(self) -> None:
        while True:
            with contextlib.suppress(zmq.ZMQError):
                await self._post(W.encode(W.Status()))
            await asyncio.sleep(self.heartbeat_s)
