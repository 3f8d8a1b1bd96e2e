"""The worker manager: `python -m workers.manager --executor E --model BASE --bind ENDPOINT`.

A broker between the gateway (front ROUTER) and inference workers and trainers (back ROUTER). A
`Generate` for a (tenant, model) goes to that pair's worker, started on first use by the
preloaded spawner; requests wait in the handle until the worker is Ready. Replies go back to the
gateway that asked. A worker that dies fails its in-flight requests (the gateway ends those
streams with an error) and is started afresh on the next request. Fine-tuning jobs are run by
the `JobScheduler`, driven by the job messages of `wire.jobs`. Never imports torch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import zmq

from state.db import Database, db_path
from state.jobs import JobStore
from wire import manager as W
from wire import spawner as S
from wire.endpoints import prepare, private_dir, runtime_dir
from wire.jobs import JobCommand, JobState, TrainerControl, TrainerHello, TrainerStopped
from workers.manager.breaker import Breakers
from workers.manager.config import ManagerConfig, parse_config
from workers.manager.executor_probe import ExecutorProbe
from workers.manager.jobs import JobScheduler
from workers.manager.pool import NoCapacity, NotYet, WorkerHandle, WorkerPool, worker_key
from workers.manager.preload import pinned_requests
from workers.manager.spawner_client import SpawnerProcess

log = logging.getLogger("workers.manager")
STOP_GRACE_S = 10.0


class Manager:
    def __init__(self, config: ManagerConfig) -> None:
        self.config = config
        self.pool = WorkerPool(max_workers=config.max_workers, idle_s=config.idle_s,
                               pinned=set(config.pinned), min_residency_s=config.min_residency_s,
                               max_evictions_per_min=config.max_evictions_per_min)
        self.waiting: list[tuple[bytes, W.Generate, int, float]] = []  # for a worker slot
        self.breakers = Breakers(threshold=config.breaker_failures,
                                 cooldown_s=config.breaker_cooldown_s)
        self.fell_back: set[str] = set()  # requests served by the base model: circuit open
        self.routes: dict[str, tuple[bytes, str]] = {}  # request id -> (gateway, worker key)
        # requests in flight that have sent nothing back yet (request, tries): a worker that
        # dies before answering them does not fail them; they go to a fresh worker once
        self.unanswered: dict[str, tuple[W.Generate, int]] = {}
        self.stopped = threading.Event()
        self.ctx = zmq.Context()
        self._own_dir: Path | None = None
        if not config.worker_bind:  # a private directory of ours, removed when we stop
            self._own_dir = Path(tempfile.mkdtemp(prefix="workers-",
                                                  dir=private_dir(runtime_dir())))
        self.worker_bind = config.worker_bind or f"ipc://{self._own_dir}/workers.sock"
        self.probe = ExecutorProbe(config.executor, self.ctx)

    def serve(self) -> None:
        self.front = self.ctx.socket(zmq.ROUTER)
        self.front.setsockopt(zmq.LINGER, 0)
        self.front.bind(prepare(self.config.bind))
        self.back = self.ctx.socket(zmq.ROUTER)
        self.back.setsockopt(zmq.LINGER, 0)
        self.back.bind(self.worker_bind)
        self.spawner = SpawnerProcess.start(self.config.model)
        self.jobs = None
        if self.config.data_dir:
            store = JobStore(Database(db_path(Path(self.config.data_dir))))
            self.jobs = JobScheduler(store, self.spawner.spawn, self._trainer_spec, self._reply,
                                     self._to_trainer, max_jobs=self.config.max_jobs)
            self.jobs.recover()
        for request in pinned_requests(self.config):
            try:
                handle, _ = self.pool.add(request.tenant, request.model)
            except NoCapacity:
                log.warning("more pinned workers than --max-workers: %s not preloaded",
                            request.model)
                continue
            log.info("preloading pinned worker %s", handle.key)
            self._start(handle, request)
        log.info("worker manager ready: model=%s bind=%s max_workers=%d max_jobs=%s",
                 self.config.model, self.config.bind, self.config.max_workers,
                 self.jobs.max_jobs if self.jobs else "- (no data dir)")
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.back, zmq.POLLIN)
        poller.register(self.spawner.stdout, zmq.POLLIN)
        poller.register(self.probe.socket, zmq.POLLIN)
        self.probe.ask()
        next_sweep = time.monotonic() + 1
        try:
            while not self.stopped.is_set():
                events = dict(poller.poll(200))
                if self.front in events:
                    self._drain(self.front, self._from_gateway)
                if self.back in events:
                    self._drain(self.back, self._from_worker)
                if self.spawner.stdout in events or self.spawner.stdout.fileno() in events:
                    for event in self.spawner.read():
                        self._from_spawner(event)
                if self.probe.socket in events:
                    self.probe.receive()
                if time.monotonic() > next_sweep:
                    next_sweep = time.monotonic() + 1
                    self._sweep()
                    stale = self.probe.ask()
                    if stale is not None:
                        poller.unregister(stale)
                        stale.close(0)
                        poller.register(self.probe.socket, zmq.POLLIN)
        finally:
            self.spawner.stop()
            self.front.close()
            self.back.close()
            self.probe.close()
            self.ctx.term()
            if self._own_dir is not None:
                shutil.rmtree(self._own_dir, ignore_errors=True)

    # -- gateway side ----------------------------------------------------------------------

    def _from_gateway(self, gateway: bytes, message: W.Message) -> None:
        if isinstance(message, W.Generate):
            self._generate(gateway, message)
        elif isinstance(message, W.Abort):
            self.unanswered.pop(message.id, None)
            self.waiting = [w for w in self.waiting if w[1].id != message.id]
            self.fell_back.discard(message.id)
            route = self.routes.pop(message.id, None)
            if route is not None:
                self._to_worker(route[1], message)
                handle = self.pool.workers.get(route[1])
                if handle is not None:
                    handle.inflight.discard(message.id)
                    handle.pending = [r for r in handle.pending if r.id != message.id]
        elif isinstance(message, W.Status):
            self._reply(gateway, self._status())
        elif isinstance(message, W.Evict):
            handle = self.pool.workers.get(worker_key(message.tenant, message.model))
            if handle is not None:
                self._stop(handle)
        elif isinstance(message, JobCommand):
            if self.jobs is None:
                self._reply(gateway, JobState(message.id, message.job_id, "unknown"))
            else:
                self.jobs.command(gateway, message)

    def _generate(self, gateway: bytes, request: W.Generate, tries: int = 1,
                  since: float | None = None) -> None:
        if request.adapter is not None and \
                not self.breakers.allow(worker_key(request.tenant, request.model)):
            if not request.fallback:
                self._reply(gateway, W.Failed(
                    request.id, 503, "circuit_open",
                    f"{request.model} failed {self.breakers.threshold} times in a row; it is "
                    f"refused for up to {self.breakers.cooldown_s:g} s, then tried again"))
                return
            self.fell_back.add(request.id)
            request = msgspec.structs.replace(request, model=self.config.model, adapter=None)
        handle = self.pool.get(request.tenant, request.model)
        if handle is None:
            try:
                handle, evicted = self.pool.add(request.tenant, request.model)
            except NotYet as exc:
                since = time.monotonic() if since is None else since
                if time.monotonic() - since < self.config.capacity_wait_s:
                    self.waiting.append((gateway, request, tries, since))
                    return
                self._reply(gateway, W.Failed(request.id, 503, "no_worker_capacity",
                                              f"No worker slot freed up in time: {exc}"))
                return
            except NoCapacity as exc:
                self._reply(gateway, W.Failed(request.id, 503, "no_worker_capacity", str(exc)))
                return
            for victim in evicted:
                log.info("evicting least recently used worker %s (age %.1f s)", victim.key,
                         time.monotonic() - victim.started)
                self._stop(victim)
            self._start(handle, request)
        self.routes[request.id] = (gateway, handle.key)
        self.unanswered[request.id] = (request, tries)
        handle.inflight.add(request.id)
        if handle.state == "ready":
            self._to_worker(handle.key, request)
        else:
            handle.pending.append(request)

    def _start(self, handle: WorkerHandle, request: W.Generate) -> None:
        self.spawner.spawn(S.WorkerSpec(
            key=handle.key, tenant=handle.tenant, model=handle.model, base=self.config.model,
            executor=self.config.executor, manager=self.worker_bind, fallback=request.fallback,
            adapter_path=request.adapter.path if request.adapter else None,
            max_batch=self.config.max_batch, threads=self.config.worker_threads,
            privacy=self.config.privacy))

    def _trainer_spec(self, job_id: str) -> S.TrainerSpec:
        return S.TrainerSpec(job_id=job_id, data_dir=str(self.config.data_dir),
                             base=self.config.model, executor=self.config.executor,
                             manager=self.worker_bind, privacy=self.config.privacy)

    def _status(self) -> W.StatusReply:
        now = time.monotonic()
        workers = [W.WorkerInfo(h.key, h.tenant, h.model, h.pid, h.state, len(h.inflight),
                                now - h.last_used, h.key in self.pool.pinned)
                   for h in self.pool.workers.values()]
        return W.StatusReply(workers, self.probe.alive, dict(self.pool.counters),
                             self.probe.metrics if self.probe.alive else "")

    # -- worker side -------------------------------------------------------------------------

    def _from_worker(self, key_bytes: bytes, message: W.Message) -> None:
        key = key_bytes.decode()
        if isinstance(message, (TrainerHello, TrainerStopped)):
            if self.jobs is not None and key == S.trainer_key(message.job_id):
                if isinstance(message, TrainerHello):
                    self.jobs.hello(message.job_id)
                else:
                    self.jobs.stopped(message.job_id, message.status)
            return
        handle = self.pool.workers.get(key)
        if isinstance(message, W.Ready):
            if handle is None:
                return
            handle.state, handle.fallback = "ready", message.fallback
            if message.fallback:
                self.pool.counters["fallbacks"] += 1
            log.info("worker %s ready in %.2f s%s", key, message.load_s,
                     " (fallback to the base model)" if message.fallback else "")
            for request in handle.pending:
                self._to_worker(key, request)
            handle.pending.clear()
        elif isinstance(message, W.LoadFailed):
            log.warning("worker %s failed to load: %s", key, message.message)
            self.breakers.failed(key)
            if handle is not None:
                self._fail_all(handle, 503, "adapter_load_failed" if "executor" not in
                               message.message else "executor_unavailable",
                               f"the model could not be loaded: {message.message}")
                handle.state = "stopping"
        elif isinstance(message, (W.Started, W.Delta, W.Done, W.Failed)):
            route = self.routes.get(message.id)
            if route is None:
                return  # aborted meanwhile
            self.unanswered.pop(message.id, None)
            if isinstance(message, W.Started) and message.id in self.fell_back:
                message.fallback = True
            if isinstance(message, W.Done):
                self.breakers.succeeded(key)
            elif isinstance(message, W.Failed) and message.status >= 500:
                self.breakers.failed(key)
            if isinstance(message, (W.Done, W.Failed)):
                self.fell_back.discard(message.id)
                del self.routes[message.id]
                if handle is not None:
                    handle.inflight.discard(message.id)
                    handle.last_used = time.monotonic()
            self._reply(route[0], message)

    def _from_spawner(self, event: S.Spawned | S.Exited) -> None:
        if isinstance(event, S.Spawned):
            if event.key.startswith(S.trainer_key("")) and self.jobs is not None:
                self.jobs.spawned(event.key.removeprefix(S.trainer_key("")), event.pid)
                return
            handle = self.pool.workers.get(event.key)
            if handle is not None:
                handle.pid = event.pid
        elif isinstance(event, S.Exited):
            if self.jobs is not None and self.jobs.exited(event.pid, event.status):
                return
            handle = self.pool.by_pid(event.pid)
            if handle is None:
                return
            self.pool.remove(handle.key)
            if handle.state != "stopping":
                self.pool.counters["worker_crashes"] += 1
                self.breakers.failed(handle.key)
                log.warning("worker %s (pid %d) died with status %s", handle.key, handle.pid,
                            event.status)
            self._retry_unanswered(handle)
            self._fail_all(handle, 503, "worker_unavailable",
                           "the worker serving this model stopped; retry the request")

    def _retry_unanswered(self, handle: WorkerHandle) -> None:
        """Requests the dead worker never answered go to a fresh worker (once each)."""
        for request_id in list(handle.inflight):
            request, tries = self.unanswered.get(request_id, (None, 0))
            route = self.routes.get(request_id)
            if request is None or route is None or tries > 1:
                continue
            handle.inflight.discard(request_id)
            del self.routes[request_id]
            del self.unanswered[request_id]  # _generate files it again (unless it refuses)
            log.info("request %s: worker %s died before answering; retrying on a new worker",
                     request_id, handle.key)
            self._generate(route[0], request, tries + 1)

    def _fail_all(self, handle: WorkerHandle, status: int, code: str, message: str) -> None:
        for request_id in list(handle.inflight):
            self.unanswered.pop(request_id, None)
            self.fell_back.discard(request_id)
            route = self.routes.pop(request_id, None)
            if route is not None:
                self._reply(route[0], W.Failed(request_id, status, code, message))
        handle.inflight.clear()
        handle.pending.clear()

    def _stop(self, handle: WorkerHandle) -> None:
        handle.state = "stopping"
        handle.last_used = time.monotonic()  # the kill deadline counts from here
        self._to_worker(handle.key, W.Stop())

    def _sweep(self) -> None:
        waiting, self.waiting = self.waiting, []
        for gateway, request, tries, since in waiting:  # room may have been made by now
            self._generate(gateway, request, tries, since)
        for handle in self.pool.idle():
            log.info("stopping idle worker %s", handle.key)
            self._stop(handle)
        for handle in list(self.pool.workers.values()):  # stopped but still there: kill
            if handle.state == "stopping" and handle.pid and \
                    time.monotonic() - handle.last_used > STOP_GRACE_S:
                _kill(handle.pid)

    # -- plumbing ------------------------------------------------------------------------------

    def _drain(self, sock: zmq.Socket, handler) -> None:
        while True:
            try:
                identity, body = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except ValueError:
                continue  # not two frames: not ours
            try:
                message = W.decode(body)
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.warning("undecodable message from %r", identity)
                continue
            handler(identity, message)

    def _reply(self, gateway: bytes, message: msgspec.Struct) -> None:
        self.front.send_multipart([gateway, W.encode(message)])

    def _to_trainer(self, job_id: str, message: TrainerControl) -> None:
        self._to_worker(S.trainer_key(job_id), message)

    def _to_worker(self, key: str, message: msgspec.Struct) -> None:
        with contextlib.suppress(zmq.ZMQError):  # not connected (yet, or anymore)
            self.back.send_multipart([key.encode(), W.encode(message)], zmq.NOBLOCK)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = parse_config(argv)
    manager = Manager(config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: manager.stopped.set())
    log.info("starting with %s", config.model_dump(exclude={"max_jobs"}))  # resolved: at ready
    manager.serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
