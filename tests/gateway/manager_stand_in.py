"""The worker manager's records and job queue behind a gateway under test, in a thread: a ROUTER
socket on the gateway's manager endpoint, answering its heartbeats, its record changes and its
job commands through the manager's own `Records` (`StoreDesk`, `JobScheduler`, `JobLedger`) on
the gateway's data dir; a `Generate` is answered 503 (no workers here), or as a test's `answer`
says; an `Abort` is noted (`aborted`). Its trainers are stand-ins (no process, no training):
each says hello at once and, asked to pause or cancel, reports that it stopped and exits."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from pathlib import Path

import msgspec
import zmq

from wire import manager as W
from wire.jobs import JobAction, JobCommand, JobStatus, TrainerAck, TrainerControl, TrainerStopped
from wire.spawner import TrainerSpec
from wire.store import StoreCommand
from workers.manager.jobs import JobScheduler
from workers.manager.records import Records
from workers.manager.specs import trainer_job

STOPPED = {JobAction.PAUSE: JobStatus.PAUSED, JobAction.CANCEL: JobStatus.CANCELLED,
           JobAction.PREEMPT: JobStatus.QUEUED}


def unavailable(message: W.Generate) -> list[W.Message]:
    return [W.Failed(message.id, 503, "worker_unavailable",
                     "no workers behind this stand-in manager")]


class ManagerStandIn:
    def __init__(self, data_dir: Path, endpoint: str, max_jobs: int = 1) -> None:
        self.records = Records(data_dir, "tiny-llama", endpoint)
        self.registry, files = self.records.registry, self.records.files
        self.started: list[str] = []  # job ids, in the order their trainers started
        self._pids = itertools.count(1000)
        self._trainers: dict[str, int] = {}  # job id -> its stand-in trainer's "pid"
        self._next: list[Callable[[], object]] = []  # trainers' doings, after each message
        self.answer: Callable[[W.Generate], list[W.Message]] = unavailable  # a worker's events
        self.aborted: list[list[str]] = []  # each Abort's request ids, in order
        self.scheduler = JobScheduler(
            self.records.ledger, self._start,
            lambda job, threads: TrainerSpec(job=trainer_job(job, files),
                                             data_dir=str(data_dir), base=job.model,
                                             executor="", manager=endpoint, threads=threads),
            self._send, self._to_trainer, max_jobs=max_jobs)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.bind(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(0)
        self._ctx.term()
        self.records.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            for identity, done in self.records.finished():  # uploads read off this loop
                self._send(identity, done)
            if not self._sock.poll(20):
                continue
            identity, data = self._sock.recv_multipart()
            for message in W.unframed(W.decode(data)):  # a request's prompts come as one
                if isinstance(message, W.Status):
                    self._send(identity, W.StatusReply([], True, {}))
                elif isinstance(message, JobCommand):
                    self.scheduler.command(identity, message)
                elif isinstance(message, StoreCommand):
                    done = self.records.take(identity, message)
                    if done is not None:
                        self._send(identity, done)
                elif isinstance(message, W.Generate):
                    for event in self.answer(message):
                        self._send(identity, event)
                elif isinstance(message, W.Abort):
                    self.aborted.append(message.ids)
                while self._next:
                    self._next.pop(0)()

    def _send(self, identity: bytes, message: msgspec.Struct) -> None:
        self._sock.send_multipart([identity, W.encode(message)])

    def _start(self, spec: TrainerSpec) -> None:
        job_id, pid = spec.job.id, next(self._pids)
        self.started.append(job_id)
        self._trainers[job_id] = pid
        self._next += [lambda: self.scheduler.spawned(job_id, pid),
                       lambda: self.scheduler.hello(job_id)]

    def _to_trainer(self, job_id: str, message: msgspec.Struct) -> None:
        if isinstance(message, TrainerControl):  # it stops after its "step"
            self._next.append(lambda: self.scheduler.report(TrainerStopped(
                job_id, STOPPED[message.action], f"Job {STOPPED[message.action].value}")))
        elif isinstance(message, TrainerAck):  # acknowledged: it exits
            self._next.append(lambda: self.scheduler.exited(self._trainers.pop(job_id), 0))
