"""The manager's end of trainers' control channels, in a thread of the test: a ROUTER socket and
the manager's own `JobLedger`, which records every report and acknowledges the last, as the
worker manager does (but for reports `unheard` picks, as a manager killed before it recorded them
would); to each trainer that says hello it sends what `greeting` holds for its job.
Trainers run in the test's process against it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import msgspec
import zmq

from state.db import Database, db_path
from wire import manager as W
from wire.jobs import TrainerAck, TrainerHello, TrainerReport
from wire.spawner import TrainerSpec
from workers.manager.file_store import FileStore
from workers.manager.job_ledger import JobLedger
from workers.manager.job_store import JobStore
from workers.manager.specs import trainer_job


class ManagerStandIn:
    def __init__(self, data_dir: Path, ipc_dir: Path) -> None:
        db = Database(db_path(data_dir))
        self.data_dir = data_dir
        self.jobs, self.files = JobStore(db), FileStore(db, data_dir)
        self.ledger = JobLedger(self.jobs, self.files, data_dir)
        self.reports: list[TrainerReport] = []
        self.greeting: list[msgspec.Struct] = []  # for a trainer that says hello (its job's)
        self.unheard: Callable[[TrainerReport], bool] = lambda report: False  # never recorded
        self.endpoint = f"ipc://{ipc_dir}/manager-stand-in.sock"
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.bind(self.endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def spec(self, job_id: str, executor: str, data_dir: Path | None = None) -> TrainerSpec:
        """What the manager would spawn the job's trainer with (its data dir may differ)."""
        return TrainerSpec(job=trainer_job(self.jobs.get(job_id), self.files),
                           data_dir=str(data_dir or self.data_dir), base="tiny-llama",
                           executor=executor, manager=self.endpoint)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        self._ctx.term()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(50):
                continue
            identity, data = self._sock.recv_multipart()
            message = W.decode(data)
            if isinstance(message, TrainerHello):
                for said in self.greeting:
                    if said.job_id == message.job_id:
                        self._sock.send_multipart([identity, W.encode(said)])
            if isinstance(message, TrainerReport) and not self.unheard(message):
                self.reports.append(message)
                if self.ledger.record(message) is not None:
                    self._sock.send_multipart([identity, W.encode(TrainerAck(message.job_id))])
