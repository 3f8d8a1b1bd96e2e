"""The worker manager: `python -m workers.manager --executor E --model BASE --bind ENDPOINT`.

A broker between the gateway (front ROUTER) and inference workers and trainers (back ROUTER). A
`Generate` goes to its tenant's worker (serving the base model and the tenant's adapters),
started by the preloaded spawner on first use; requests wait in the handle until it is Ready. A
worker that dies fails its in-flight requests and is started afresh on the next one. Jobs run by
the `JobScheduler` (`wire.jobs`); records change by the `StoreDesk` (`wire.store`): this process
is their one writer. Never imports torch."""

from __future__ import annotations

import logging
import shutil
import time
from functools import partial
from pathlib import Path

import zmq

from wire import manager as W
from wire import spawner as S
from wire.endpoints import fresh_dir, prepare, runtime_dir
from wire.jobs import JobCommand, JobState, JobStatus, TrainerHello, TrainerReport
from wire.stopping import StopSignal
from wire.store import StoreCommand
from workers.manager.admission import Admission
from workers.manager.capacity import ThreadShare, host_cores, job_capacity
from workers.manager.config import ManagerConfig
from workers.manager.executor_probe import ExecutorProbes
from workers.manager.jobs import JobScheduler
from workers.manager.links import Links
from workers.manager.pool import NoCapacity, NotYet, WorkerHandle, WorkerPool, model_key
from workers.manager.preload import preload
from workers.manager.records import Records, answer
from workers.manager.requests import Requests
from workers.manager.spawner_client import SpawnerProcess
from workers.manager.specs import trainer_spec, worker_spec
from workers.manager.worker_threads import WorkerThreads

log = logging.getLogger("workers.manager")
STOP_GRACE_S = 10.0


class Manager:
    def __init__(self, config: ManagerConfig, stopped: StopSignal) -> None:
        self.config = config
        self.pool = WorkerPool(max_workers=config.max_workers, idle_s=config.idle_s,
                               pinned=set(config.pinned), min_residency_s=config.min_residency_s,
                               max_evictions_per_min=config.max_evictions_per_min,
                               shared_workers=config.shared_workers,
                               shared_tenants=config.shared_tenant_ids)
        self.admission = Admission(config)
        self.requests = Requests()
        self.stopped = stopped  # set by SIGTERM or SIGINT (made in the main thread)
        self.ctx = zmq.Context()
        self._own_dir: Path | None = None  # made once the data dir is ours (`serve`)
        self.worker_bind = config.worker_bind
        self.probes = ExecutorProbes(config.executor, config.training_executor, self.ctx)
        self.threads = WorkerThreads(self.pool, ThreadShare(host_cores(), config.worker_threads),
                                     lambda key, message: self.links.to_worker(key, message))

    def serve(self) -> None:
        self.records = self.jobs = None
        if self.config.data_dir:  # first: a second manager on the data dir stops here (Busy)
            self.records = Records(Path(self.config.data_dir), self.config.model, self.config.bind)
        if not self.worker_bind:  # a private directory of ours, removed when we stop
            self._own_dir = fresh_dir(runtime_dir(), "workers-", "workers.sock")
            self.worker_bind = f"ipc://{self._own_dir}/workers.sock"
        self.links = Links(self.ctx, prepare(self.config.bind), self.worker_bind)
        self.spawner = SpawnerProcess.start(self.config.model)
        if self.records is not None:
            max_jobs, budget = job_capacity(  # privacy: a trainer's labels never leave it
                self.config.max_jobs, self.config.model,
                lambda: self.probes.serving.offers_head_loss and not self.config.privacy)
            spec = partial(trainer_spec, self.config, self.worker_bind, self.records.files)
            self.jobs = JobScheduler(self.records.ledger, self.spawner.spawn, spec,
                                     self.links.reply, self.links.to_trainer,
                                     max_jobs=max_jobs, budget=budget,
                                     threads=ThreadShare(host_cores(), self.config.trainer_threads))
            self.jobs.recover()
        preload(self.config, self.pool, self._start)
        log.info("worker manager ready: model=%s bind=%s max_workers=%d max_jobs=%s",
                 self.config.model, self.config.bind, self.config.max_workers,
                 self.jobs.max_jobs if self.jobs else "- (no data dir)")
        poller = zmq.Poller()
        self.links.register(poller)
        poller.register(self.spawner.stdout, zmq.POLLIN)
        self.probes.register(poller)
        if self.records is not None:  # an adapter upload read off the loop is done
            poller.register(self.records.inspector.fileno(), zmq.POLLIN)
        self.probes.ask(poller)
        next_sweep = time.monotonic() + 1
        try:
            while not self.stopped.is_set():
                events = dict(poller.poll(200))
                self.links.drain(events, self._from_gateway, self._from_worker)
                if self.spawner.stdout in events or self.spawner.stdout.fileno() in events:
                    for event in self.spawner.read():
                        self._from_spawner(event)
                if self.probes.receive(events) and self.jobs is not None:
                    self.jobs.schedule()  # the head's loss offered: queued jobs may fit now
                if self.records is not None and self.records.inspector.fileno() in events:
                    for gateway, done in self.records.finished():
                        self.links.reply(gateway, done)
                self.threads.tell()
                if time.monotonic() > next_sweep:
                    next_sweep = time.monotonic() + 1
                    self._sweep()
                    self.probes.ask(poller)
                self.links.flush()  # what this turn held: one frame a peer
        finally:
            self.spawner.stop()
            self.links.close()
            self.probes.close()
            self.ctx.term()
            if self.records is not None:
                self.records.close()
            if self._own_dir is not None:
                shutil.rmtree(self._own_dir, ignore_errors=True)

    # -- gateway side ----------------------------------------------------------------------

    def _from_gateway(self, gateway: bytes, message: W.Message) -> None:
        if isinstance(message, W.Generate | W.Generates):  # a request's prompts: each in turn
            for request in W.unframed(message):
                self._generate(gateway, self.admission.received(request))
        elif isinstance(message, W.Abort):  # each worker told of its own in one message
            for request_id in message.ids:
                self.admission.forget(request_id)
            for key, ids in self.requests.drop_all(message.ids).items():
                self.links.to_worker(key, W.Abort(ids))
                self.pool.forget(key, ids)
        elif isinstance(message, W.Status):
            self.links.reply(gateway, self._status())
        elif isinstance(message, W.Prefetch):  # to a worker that is up; none is started for it
            handle = self.pool.of_tenant(message.tenant)
            if handle is not None and handle.state == "ready":
                handle.models.add(message.model)
                self.links.to_worker(handle.key, message)
        elif isinstance(message, StoreCommand):  # what it deleted, its worker lets go
            done, handle = answer(self.records, gateway, message), \
                self.pool.of_tenant(message.tenant)
            if done is None:  # an upload, read off the loop: answered once done
                return
            for model in set(done.deleted) & (handle.models if handle else set()):
                handle.models.discard(model)
                self.links.to_worker(handle.key, W.Unload(model))
            self.links.reply(gateway, done)
        elif isinstance(message, JobCommand) and self.jobs is not None:
            self.jobs.command(gateway, message)
        elif isinstance(message, JobCommand):  # no job queue (no data dir)
            self.links.reply(gateway, JobState(message.id, message.job_id, JobStatus.UNKNOWN,
                                               False))

    def _generate(self, gateway: bytes, request: W.Generate, tries: int = 1,
                  since: float | None = None) -> None:
        admitted = self.admission.admit(request)
        if isinstance(admitted, W.Failed):
            self.links.reply(gateway, admitted)
            return
        request = admitted
        handle = self.pool.get(request.tenant)
        if handle is None:
            try:
                handle, evicted = self.pool.add(request.tenant)
            except NotYet as exc:
                failed = self.admission.wait(gateway, request, tries, since, exc)
                if failed is not None:
                    self.links.reply(gateway, failed)
                return
            except NoCapacity as exc:
                self.links.reply(gateway, W.Failed(request.id, 503, "no_worker_capacity", str(exc)))
                return
            for victim in evicted:
                log.info("evicting least recently used worker %s (age %.1f s)", victim.key,
                         time.monotonic() - victim.started)
                self._stop(victim)
            self._start(handle)
        self.requests.add(gateway, request, handle.key, tries)
        handle.inflight[request.id] = model_key(request.tenant, request.model)
        handle.models.add(request.model)
        if handle.state == "ready":
            self.links.to_worker(handle.key, request)
        else:
            handle.pending[request.id] = request

    def _start(self, handle: WorkerHandle) -> None:
        self.threads.spawning(handle)
        self.spawner.spawn(worker_spec(self.config, self.worker_bind, handle))

    def _status(self) -> W.StatusReply:
        return W.StatusReply(self.pool.infos(), self.probes.serving.alive,
                             dict(self.pool.counters), *self.probes.figures(),
                             self.probes.training_up())

    # -- worker side -------------------------------------------------------------------------

    def _from_worker(self, key_bytes: bytes, message: W.Message) -> None:
        key = key_bytes.decode()
        if isinstance(message, (TrainerHello, TrainerReport)):
            if self.jobs is not None and key == S.trainer_key(message.job_id):
                if isinstance(message, TrainerHello):
                    self.jobs.hello(message.job_id)
                else:
                    self.jobs.report(message)
            return
        handle = self.pool.workers.get(key)
        if isinstance(message, W.Ready):
            if handle is None:
                return
            handle.state = "ready"
            log.info("worker %s ready in %.2f s", key, message.load_s)
            for request in handle.pending.values():
                self.links.to_worker(key, request)
            handle.pending.clear()
        elif isinstance(message, W.AdapterCache):
            if handle is not None:
                handle.adapters = message
        elif isinstance(message, W.LoadFailed):
            log.warning("worker %s failed to start: %s", key, message.message)
            if handle is not None:
                self._failed_models(handle)
                self._fail_all(handle, 503, message.code,
                               f"the model could not be loaded: {message.message}")
                handle.state = "stopping"
        elif isinstance(message, W.Reply | W.Replies):
            for reply in W.unframed(message):
                self._pass_on(handle, reply)

    def _pass_on(self, handle: WorkerHandle | None, reply: W.Reply) -> None:
        route = self.requests.answer(reply)
        if route is None:
            return  # aborted meanwhile
        gateway, tenant_model = route
        if isinstance(reply, W.Started) and reply.fallback:
            self.pool.counters["fallbacks"] += 1  # the worker could not load the adapter
        self.admission.observe(tenant_model, reply)
        if isinstance(reply, (W.Done, W.Failed)) and handle is not None:
            handle.inflight.pop(reply.id, None)
            handle.last_used = time.monotonic()
        self.links.reply(gateway, reply)

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
                self._failed_models(handle)
                log.warning("worker %s (pid %d) died with status %s", handle.key, handle.pid,
                            event.status)
            for gateway, request, tries in self.requests.unanswered_on(handle):
                log.info("request %s: worker %s died before answering; retrying on a new "
                         "worker", request.id, handle.key)
                self._generate(gateway, request, tries + 1)
            self._fail_all(handle, 503, "worker_unavailable",
                           "the worker serving this model stopped; retry the request")

    def _failed_models(self, handle: WorkerHandle) -> None:
        """Each model the worker served (it did not start, or died) fails once in its breaker."""
        for tenant_model in set(handle.inflight.values()):
            self.admission.breakers.failed(tenant_model)

    def _fail_all(self, handle: WorkerHandle, status: int, code: str, message: str) -> None:
        for request_id in list(handle.inflight):
            self.admission.forget(request_id)
            route = self.requests.drop(request_id)
            if route is not None:
                self.links.reply(route[0], W.Failed(request_id, status, code, message))
        handle.inflight.clear()
        handle.pending.clear()

    def _stop(self, handle: WorkerHandle) -> None:
        handle.state = "stopping"
        handle.last_used = time.monotonic()  # the kill deadline counts from here
        self.links.to_worker(handle.key, W.Stop())

    def _sweep(self) -> None:
        if self.records is not None:
            self.records.expire()
        for gateway, request, tries, since in self.admission.due():  # room may be made now
            self._generate(gateway, request, tries, since)
        for handle in self.pool.idle():
            log.info("stopping idle worker %s", handle.key)
            self._stop(handle)
        for handle in list(self.pool.workers.values()):  # stopped but still there: kill
            if handle.state == "stopping" and handle.pid and \
                    time.monotonic() - handle.last_used > STOP_GRACE_S:
                self.spawner.kill(handle.pid)
