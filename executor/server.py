"""The executor's serving loop: two identical threads around one ROUTER socket and the same-host
clients' doorbells (leader/follower).

The thread holding the baton waits on the socket and the doorbells; when it wakes it drains every
message (decode, validate, map tensors from shared memory or frames, queue calls, answer pings and
stats at once) and, if the compute slot is free, runs ready batches (`Engine`) and sends their
replies itself. So an idle executor hands no call between threads (each hand-over costs 100-200 us
on a small VM). Before a long batch it passes the baton, and the other thread keeps receiving and
answering meanwhile. The socket is shared under a lock; whoever holds it drains what has arrived
(its FD only signals edges). A bad message gets an error reply to its sender alone; nothing a
client sends can stop the executor or fail another client's call.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time

import msgspec
import zmq

from executor.baton import Baton
from executor.calls import PendingCall
from executor.clients import ClientState, ClientTable
from executor.config import ExecutorConfig
from executor.engine import Engine
from executor.interleave import Interleave
from executor.registry import LayerRegistry
from executor.requests import Requests, Tap
from executor.scheduler import Scheduler
from executor.scheduling import build_scheduler, macs_per_row
from executor.stats import ExecutorStats
from executor.validation import CallRejected, CallTable, check_doorbell
from wire.call import doorbell as bell
from wire.call import messages as P
from wire.call.header import DECODE, FLEX, SPIN_SAFE
from wire.call.spin import AdaptiveSpin, watch
from wire.endpoints import prepare

log = logging.getLogger("executor.server")

POLLIN = int(zmq.POLLIN)
LONG_BATCH_MACS = 1 << 23  # ~0.1-0.3 ms of matmul on a small CPU: worth a thread hand-over


class ExecutorServer:
    def __init__(self, registry: LayerRegistry, config: ExecutorConfig, *,
                 scheduler: Scheduler | None = None, tap: Tap | None = None) -> None:
        self.registry = registry
        self.config = config
        self.scheduler = scheduler or build_scheduler(config, registry)
        self.clients = ClientTable(config.device)
        self.stats = ExecutorStats(self.scheduler.targets, self.scheduler.training_slice_s,
                                   training_share=self.scheduler.training_share_now,
                                   head_loss=registry.offers_head_loss)
        self.engine = Engine(registry, self.scheduler, self.clients, self.stats, config.device)
        self.tap = tap
        self.stopped = threading.Event()
        self._ctx = zmq.Context()
        self._socket_lock = threading.Lock()
        self._compute_slot = threading.Lock()
        self._baton = Baton()
        self._interleave = Interleave(self.scheduler, self.engine, self._reply,
                                      self._baton.pass_on)
        self._nudge_r, self._nudge_w = os.pipe2(os.O_NONBLOCK)  # wakes the baton holder
        self._macs_per_row = macs_per_row(registry)
        self._next_expiry = time.monotonic() + 60
        self._threads: list[threading.Thread] = []
        self._table = CallTable(registry.specs)
        self._requests = Requests(registry, config, self.scheduler, self.clients, self.stats,
                                  self._table, self._send, tap)
        self._bells: dict[int, ClientState] = {}
        self._router_fd = -1
        self._spinner = AdaptiveSpin(limit_s=config.spin_us * 1e-6)

    def start(self) -> None:
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        if self.config.curve_secret_key:
            secret = self.config.curve_secret_key.encode()
            self._router.curve_secretkey = secret
            self._router.curve_publickey = zmq.curve_public(secret)
            self._router.curve_server = True
        self._router.bind(prepare(self.config.bind))
        for i in range(2):
            thread = threading.Thread(target=self._loop, name=f"executor-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        self.stopped.set()
        for thread in self._threads:
            thread.join(timeout)
        self._ctx.destroy(linger=0)  # closes the router too; never waits on a dead peer
        os.close(self._nudge_r)
        os.close(self._nudge_w)

    def _loop(self) -> None:
        poller, generation = None, -1
        try:
            while not self.stopped.is_set():
                if not self._baton.take(timeout=0.1):
                    continue
                try:
                    if generation != self.clients.generation:
                        generation = self.clients.generation
                        poller = self._watch()
                    # While the other thread computes, it also runs whatever becomes ready, so
                    # this one only sleeps until a message comes: watching shared memory would
                    # steal the GIL and a core from the batch (8-row llama-160m pass on 2 cores:
                    # 48-58 ms of compute without a watcher, 57-72 ms with one).
                    computing = self._compute_slot.locked()
                    ready_in = None if computing else self.scheduler.ready_in()
                    idle = ready_in is None and not computing
                    waited = time.perf_counter()
                    events = self._spin(poller) if idle else []
                    if not events:
                        events = poller.poll(50 if ready_in is None else min(50, ready_in * 1e3))
                    if idle:  # a wait that ran out (no call came) counts against watching
                        self._spinner.observe(time.perf_counter() - waited)
                    self._receive(events)
                    self._compute()
                    self._expire()
                except Exception:  # a serving thread must outlive anything one client does
                    log.exception("serving loop")
                    generation = -1
        finally:
            self._baton.pass_on()

    def _watch(self) -> select.poll:
        """A poller on the router, the nudge pipe and every open doorbell (whose fds map to
        their clients, so a wake-up reads only the doorbells that rang)."""
        poller = select.poll()
        with self._socket_lock:  # ZeroMQ sockets are not thread-safe, even for getsockopt
            self._router_fd = self._router.getsockopt(zmq.FD)
        poller.register(self._router_fd, select.POLLIN)
        poller.register(self._nudge_r, select.POLLIN)
        self._bells = {}
        for client in self.clients.with_doorbells():
            if (fd := client.doorbell.fd) >= 0:  # closed meanwhile by the other thread
                poller.register(fd, select.POLLIN)
                self._bells[fd] = client
        return poller

    def _spin(self, poller: select.poll) -> list[tuple[int, int]]:
        """Watch the doorbell clients' call headers (no system call) while calls have lately
        come soon after the executor went idle (`AdaptiveSpin`); the doorbells of the clients
        that called, or [] to sleep in poll. A poll(0) now and then catches socket messages."""
        budget = self._spinner.budget()
        if budget <= 0 or not self._bells or not SPIN_SAFE:
            return []
        watched = list(self._bells.items())
        looks = 0

        def look() -> list[tuple[int, int]] | bool:
            nonlocal looks
            looks += 1
            if looks % 16 == 0 and poller.poll(0):
                return True  # a socket message or a nudge: stop watching
            return [(fd, POLLIN) for fd, client in watched
                    if client.port is not None and client.port.pending()]

        found = watch(look, budget)
        return found if isinstance(found, list) else []

    def _compute(self) -> None:
        """Run ready batches while holding the compute slot; re-check after letting it go, so a
        call queued by the other thread meanwhile is never left waiting for a wake-up. Before a
        long batch the baton goes to the other thread, which keeps receiving meanwhile; short
        ones run inline, so a quiet executor answers with no thread hand-over at all."""
        while self._compute_slot.acquire(blocking=False):
            try:
                while (batch := self.scheduler.next_batch()) is not None:
                    if sum(c.rows for c in batch) * self._macs_per_row[batch[0].layer] \
                            >= LONG_BATCH_MACS:
                        self._baton.pass_on()
                    self._reply(self.engine.execute(batch,
                                                    between=self._interleave.between(batch)))
                self.clients.settle()
            finally:
                self._compute_slot.release()
            if self.scheduler.ready_in() != 0.0:
                if not self._baton.held():  # the holder's poll timed itself to our compute
                    with contextlib.suppress(BlockingIOError):
                        os.write(self._nudge_w, b"\0")
                return

    def _reply(self, replies: list) -> None:
        """Send the socket calls' replies (doorbell calls were answered by the engine). A send
        can swallow the router's wake-up for messages that came meanwhile: drain after it."""
        if not replies:
            return
        with self._socket_lock:
            for identity, frames in replies:
                self._router.send_multipart([identity, *frames], copy=False)
            self._drain()

    def _expire(self) -> None:
        if time.monotonic() < self._next_expiry:
            return
        self._next_expiry = time.monotonic() + 60
        for name in self.clients.expire(self.config.client_idle_s):
            log.info("forgot idle client %s", name)

    def _receive(self, events: list[tuple[int, int]]) -> None:
        """Handle what woke the poller: the doorbells that rang (only those), and the router
        when its FD signalled (it signals edges: every send drains it again, see `_reply`)."""
        router = False
        for fd, _ in events:
            client = self._bells.get(fd)
            if client is None:
                if fd == self._nudge_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._nudge_r, 4096)
                router = router or fd == self._router_fd
                continue
            try:
                client.doorbell.rang()  # takes the ring; the header says whether it is new
                self._ring(client)
            except bell.Hangup:
                log.info("client %s closed its doorbell: forgotten", client.name)
                self._requests.forget(client.identity)
        if router:
            with self._socket_lock:
                self._drain()

    def _ring(self, client: ClientState) -> None:
        """A call whose header waits in the client's shared memory."""
        port = client.port
        if port is None:
            return
        header = port.take()
        if header is None:
            return
        seq, call_id = header[0], header[1]
        try:
            x = check_doorbell(self._table, port, header, self.registry.dtype)
        except CallRejected as rejected:
            self.stats.record_error()
            port.refuse(seq, call_id, rejected.code, rejected.message)
            return
        client.last_seen = now = self.scheduler.clock()
        call = P.Call(call_id, header[2], header[6], header[3], "", (), header[9], header[10],
                      header[11], header[12], bool(header[13] & DECODE),
                      bool(header[13] & FLEX))
        if self.tap is not None:
            self.tap(client.name, call, x.clone())
        self.scheduler.add(PendingCall(client.identity, call, x, now, reply_seq=seq))

    def _drain(self) -> None:
        """Handle every message that has arrived. Call with the socket lock held."""
        while self._router.getsockopt(zmq.EVENTS) & POLLIN:
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity, body = frames[0].bytes, frames[1:]
            try:
                self._requests.handle(identity, body)
            except CallRejected as rejected:
                self.stats.record_error()
                self._send(identity, P.Error(rejected.call_id, rejected.code, rejected.message))
            except Exception as exc:  # never let one message take the IO thread down
                log.exception("message from %r failed", identity)
                self.stats.record_error()
                self._send(identity, P.Error(-1, P.ErrorCode.INTERNAL, f"{type(exc).__name__}"))

    def _send(self, identity: bytes, message: msgspec.Struct) -> None:
        self._router.send_multipart([identity, P.encode(message)])
