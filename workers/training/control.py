"""A trainer's line to the worker manager: it says hello, takes pause and cancel and its share
of the cores between steps (a non-blocking look at its socket, no database read), reports what
the job did (events, checkpoints, the end) and waits for the manager to acknowledge its last
report before it exits. The manager records every report: a trainer never writes the job's
state itself."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time

import msgspec
import zmq

from wire import manager as W
from wire.jobs import (
    JobAction,
    TrainerAck,
    TrainerControl,
    TrainerHello,
    TrainerReport,
    TrainerThreads,
)
from wire.spawner import trainer_key

log = logging.getLogger("workers.trainer")
ACK_TIMEOUT_S = 120.0  # the manager registers the adapter and stores the results first


class ControlChannel:
    def __init__(self, endpoint: str, job_id: str) -> None:
        self.job_id = job_id
        self._ctx = zmq.Context()
        self._requested: JobAction | None = None
        self.threads: int | None = None  # torch threads the manager last gave it, if any
        self.stopping = False  # SIGTERM came: the service is stopping (`stop_on_sigterm`)
        self._sigterm: object = None  # the handler before ours, put back on close
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 1000)
        self._sock.setsockopt(zmq.SNDHWM, 0)  # reports queue until the manager takes them
        self._sock.setsockopt(zmq.IDENTITY, trainer_key(job_id).encode())
        self._sock.connect(endpoint)
        self._send(TrainerHello(job_id, os.getpid()))

    def stop_on_sigterm(self) -> None:
        """SIGTERM (the service stopping) asks the job to stop at its next step's start, with a
        checkpoint, instead of ending the process mid-step."""
        self._sigterm = signal.signal(signal.SIGTERM,
                                      lambda *_: setattr(self, "stopping", True))

    def requested(self) -> JobAction | None:
        """PAUSE or CANCEL if the manager asked for it (the latest ask wins; cancel beats
        pause), else None; `threads` as last told. Never blocks."""
        while self._sock.poll(0):
            self._take(self._sock.recv())
        return self._requested

    def report(self, message: TrainerReport) -> None:
        """Started, an event or a checkpoint: recorded by the manager in the order sent."""
        self._send(message)

    def last(self, message: TrainerReport, timeout_s: float = ACK_TIMEOUT_S) -> bool:
        """The last report (finished or stopped): True once the manager recorded it."""
        self._send(message)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not self._sock.poll(int(left * 1000) + 1):
                break
            if self._take(self._sock.recv()):
                return True
        log.warning("job %s: the manager did not acknowledge its last report", self.job_id)
        return False

    def close(self) -> None:
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        self._sock.close()
        self._ctx.term()

    def _take(self, data: bytes) -> bool:
        """One message from the manager; True if it acknowledges our last report."""
        try:
            message = W.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("undecodable control message dropped")
            return False
        if getattr(message, "job_id", None) != self.job_id:
            return False
        if isinstance(message, TrainerAck):
            return True
        if isinstance(message, TrainerThreads):
            self.threads = message.threads
        if isinstance(message, TrainerControl) and self._requested != JobAction.CANCEL:
            self._requested = message.action
        return False

    def _send(self, message: msgspec.Struct) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._sock.send(W.encode(message), zmq.NOBLOCK)
