"""A trainer's line to the worker manager: it says hello, takes pause and cancel between steps
(a non-blocking look at its socket, no database read), and says how it stopped."""

from __future__ import annotations

import contextlib
import logging
import os

import msgspec
import zmq

from wire import manager as W
from wire.jobs import JobAction, JobStatus, TrainerControl, TrainerHello, TrainerStopped
from wire.spawner import trainer_key

log = logging.getLogger("workers.trainer")


class ControlChannel:
    def __init__(self, endpoint: str | None, job_id: str) -> None:
        self.job_id = job_id
        self._ctx = zmq.Context()
        self._sock: zmq.Socket | None = None
        self._requested: JobAction | None = None
        if endpoint:
            self._sock = self._ctx.socket(zmq.DEALER)
            self._sock.setsockopt(zmq.LINGER, 1000)
            self._sock.setsockopt(zmq.IDENTITY, trainer_key(job_id).encode())
            self._sock.connect(endpoint)
            self._send(TrainerHello(job_id, os.getpid()))

    def requested(self) -> JobAction | None:
        """PAUSE or CANCEL if the manager asked for it (the latest ask wins; cancel beats
        pause), else None. Never blocks."""
        while self._sock is not None and self._sock.poll(0):
            try:
                message = W.decode(self._sock.recv())
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.warning("undecodable control message dropped")
                continue
            if isinstance(message, TrainerControl) and message.job_id == self.job_id \
                    and self._requested != JobAction.CANCEL:
                self._requested = message.action
        return self._requested

    def stopped(self, status: str) -> None:
        self._send(TrainerStopped(self.job_id, JobStatus(status)))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._ctx.term()

    def _send(self, message: msgspec.Struct) -> None:
        if self._sock is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.send(W.encode(message), zmq.NOBLOCK)
