"""Torch-free questions to the executor (is it up? its metrics), for the manager's status.

Non-blocking: `ask()` sends a stats request, the owner polls `socket` and calls `receive()`;
`alive` says whether an answer came recently. A socket that went unanswered is replaced, so a
restarted executor is picked up.
"""

from __future__ import annotations

import contextlib
import time

import msgspec
import zmq

from wire.call import messages as P
from wire.figures import ExecutorFigures
from wire.probes import connect_all


class ExecutorProbe:
    def __init__(self, endpoint: str, ctx: zmq.Context, *, stale_s: float = 5.0) -> None:
        self.endpoint = endpoint
        self.ctx = ctx
        self.stale_s = stale_s
        self.figures: ExecutorFigures | None = None
        self.last_answer = 0.0
        self._asked = 0.0
        self.socket = self._connect()

    @property
    def alive(self) -> bool:
        return time.monotonic() - self.last_answer < self.stale_s

    @property
    def offers_head_loss(self) -> bool:
        """Whether the executor, answering now, computes the head's loss for trainers."""
        return self.alive and self.figures is not None and self.figures.head_loss

    def ask(self, poller: zmq.Poller) -> None:
        """Send a stats request, first replacing a socket that went unanswered (in `poller`
        too, the owner's, which watches `socket`)."""
        if self._asked > self.last_answer and time.monotonic() - self._asked > self.stale_s:
            poller.unregister(self.socket)
            self.socket.close(0)
            self.socket = self._connect()
            poller.register(self.socket, zmq.POLLIN)
        self._asked = time.monotonic()
        with contextlib.suppress(zmq.Again):  # the executor is not taking messages: it is down
            self.socket.send(P.encode(P.StatsRequest()), zmq.NOBLOCK)

    def receive(self) -> bool:
        """Read what came; True when the executor has just come to offer the head's loss (jobs
        count less memory from now on)."""
        offered = self.offers_head_loss
        while True:
            try:
                data = self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return self.offers_head_loss and not offered
            try:
                reply = P.decode_reply(data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            if isinstance(reply, P.Stats):
                self.figures = reply.figures
                self.last_answer = time.monotonic()

    def close(self) -> None:
        self.socket.close(0)

    def _connect(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 4)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # replicas: the requests go to those connected
        connect_all(sock, self.endpoint)
        return sock


class ExecutorProbes:
    """The serving executor's probe and, where fine-tuning jobs have an executor of their own
    (the idle twin: `training_executor`), that one's too, polled together."""

    def __init__(self, executor: str, training_executor: str, ctx: zmq.Context) -> None:
        self.serving = ExecutorProbe(executor, ctx)
        self.training = ExecutorProbe(training_executor, ctx) \
            if training_executor and training_executor != executor else None
        self._all = [p for p in (self.serving, self.training) if p is not None]

    def register(self, poller: zmq.Poller) -> None:
        for probe in self._all:
            poller.register(probe.socket, zmq.POLLIN)

    def ask(self, poller: zmq.Poller) -> None:
        for probe in self._all:
            probe.ask(poller)

    def receive(self, events: dict) -> bool:
        """Read what came; True when the serving executor has just come to offer the head's
        loss (`ExecutorProbe.receive`)."""
        if self.training is not None and self.training.socket in events:
            self.training.receive()
        return self.serving.socket in events and self.serving.receive()

    def figures(self) -> tuple[ExecutorFigures | None, ExecutorFigures | None]:
        """(the serving executor's, the training executor's), each None unless it answers."""
        return _answered(self.serving), _answered(self.training)

    def training_up(self) -> bool | None:
        """Whether the training executor answers; None where the jobs have none of their own."""
        return None if self.training is None else self.training.alive

    def close(self) -> None:
        for probe in self._all:
            probe.close()


def _answered(probe: ExecutorProbe | None) -> ExecutorFigures | None:
    return probe.figures if probe is not None and probe.alive else None
