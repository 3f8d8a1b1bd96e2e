"""Start and stop the whole system as host processes: executor, worker manager, gateway.

Used by `symbiosis serve` and by the end-to-end tests. Each child's stderr is kept (and relayed
with a prefix when asked); each is started only once the previous one answers its own probe
(the executor and the manager a ping on their sockets, its idle twin's too
(`launcher.idle_training`), the gateway `/health`). The HTTP port is bound here, exclusively,
before anything starts (the gateway serves on the inherited socket), so a port in use fails at
once and a restarted gateway never races for it. `supervise()` restarts a service that died,
with exponential backoff (as compose's `restart: unless-stopped` does).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from launcher.claim import claim, release
from launcher.idle_training import idle_training
from launcher.mps import MpsDaemon
from wire.endpoints import private_dir, runtime_dir
from wire.probes import executor_answers, manager_answers


class PortInUse(OSError):
    pass


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)
    restarts: int = 0  # in a row, without a minute of uptime since
    retry_at: float = 0.0

    def alive(self) -> bool:
        return self.proc.poll() is None


BACKOFF_S = (0.5, 1, 2, 4, 8, 16, 30)
STABLE_S = 60.0  # up this long: the next crash starts the backoff again


@dataclass
class Stack:
    data_dir: Path
    model: str = "tiny-llama"
    host: str = "127.0.0.1"
    port: int = 8000
    env: dict[str, str] = field(default_factory=dict)
    executor_args: tuple[str, ...] = ()
    manager_args: tuple[str, ...] = ()
    echo: bool = False  # relay the services' logs to our stderr
    services: dict[str, Service] = field(default_factory=dict)
    listener: socket.socket | None = None
    mps: MpsDaemon | None = None  # started for an executor and workers on one GPU
    claim_fd: int | None = None  # this stack's claim on its data dir (`launcher.claim`)
    _recipes: dict[str, tuple] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        """The stack's sockets: a short directory (ipc:// paths are limited to ~100 bytes)
        keyed by the data dir, inside this user's private runtime directory."""
        digest = hashlib.sha1(str(self.data_dir.resolve()).encode()).hexdigest()[:10]
        return runtime_dir() / digest

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def service_env(self) -> dict[str, str]:
        return {
            **os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false",
            "SYMBIOSIS_DATA_DIR": str(self.data_dir), "SYMBIOSIS_MODEL": self.model,
            "SYMBIOSIS_EXECUTOR": f"ipc://{self.run_dir}/executor.sock",
            "SYMBIOSIS_MANAGER": f"ipc://{self.run_dir}/manager.sock",
            "SYMBIOSIS_HOST": self.host, "SYMBIOSIS_PORT": str(self.port), **self.env,
            **(self.mps.env() if self.mps is not None else {}),
            "SYMBIOSIS_TRAINING_EXECUTOR": (  # "": the trainers use the executor
                f"ipc://{self.run_dir}/training-executor.sock" if self.idle_training else ""),
        }

    @property
    def idle_training(self) -> bool:  # the jobs' own executor: the idle twin (`executor.twin`)
        return idle_training({**os.environ, **self.env}, self.executor_args)

    def claim(self) -> None:  # the data dir for this stack (DataDirInUse: another has it)
        if self.claim_fd is None:
            self.claim_fd = claim(self.data_dir)

    def bind(self) -> socket.socket:
        """Bind and listen on the HTTP port (raises PortInUse); port 0 picks a free one."""
        if self.listener is None:
            listener = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT only
            try:
                listener.bind((self.host, self.port))
            except OSError as exc:
                listener.close()
                raise PortInUse(f"cannot listen on {self.host}:{self.port}: {exc.strerror}") \
                    from None
            listener.listen(2048)
            listener.set_inheritable(True)
            self.port = listener.getsockname()[1]
            self.listener = listener
        return self.listener

    def start(self, timeout_s: float = 300) -> Stack:
        self.claim()
        private_dir(runtime_dir())
        private_dir(self.run_dir)
        try:
            fd = self.bind().fileno()
        except PortInUse:
            self.stop()
            raise
        self.start_mps()
        env = self.service_env()
        self._recipes = {
            "executor": self._executor(env["SYMBIOSIS_EXECUTOR"],
                                       env["SYMBIOSIS_TRAINING_EXECUTOR"]),
            "manager": ([sys.executable, "-m", "workers.manager", "--executor",
                         env["SYMBIOSIS_EXECUTOR"], "--model", self.model, "--bind",
                         env["SYMBIOSIS_MANAGER"], *self.manager_args],
                        lambda: manager_answers(env["SYMBIOSIS_MANAGER"], 1000), ()),
            "gateway": ([sys.executable, "-m", "gateway", "--fd", str(fd)], self._http_ok,
                        (fd,)),
        }
        try:
            for name in self._recipes:
                self._start(name, env, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _executor(self, endpoint: str, twin: str) -> tuple:
        """The executor's command line (its idle twin's endpoint, if any) and readiness."""
        flags = ("--idle-twin", twin) if twin else ()
        return ([sys.executable, "-m", "executor", "--model", self.model, "--bind", endpoint,
                 *self.executor_args, *flags],
                lambda: all(executor_answers(e, 1000) for e in (endpoint, twin) if e), ())

    def supervise(self, timeout_s: float = 120) -> list[str]:
        """Restart every service that died: at once after a minute of uptime, else after a
        backoff that doubles with each quick death in a row. Returns what it did."""
        done = []
        now = time.monotonic()
        for name, service in list(self.services.items()):
            if service.alive() or now < service.retry_at:
                continue
            if service.retry_at == 0.0:  # a death not seen before
                quick = now - service.started_at < STABLE_S
                service.restarts = service.restarts + 1 if quick else 0
                delay = BACKOFF_S[min(service.restarts, len(BACKOFF_S)) - 1] \
                    if service.restarts else 0.0
                service.retry_at = now + delay
                done.append(f"{name} exited (code {service.proc.returncode}); restarting"
                            + (f" in {delay:g} s" if delay else ""))
                if delay:
                    continue
            try:
                revived = self._start(name, self.service_env(), timeout_s)
                done.append(f"{name} is back")
            except RuntimeError as exc:
                revived = self.services[name]  # the attempt that did not come up: a quick death
                done.append(f"{name} did not come back: {str(exc).splitlines()[0]}")
            revived.restarts = service.restarts
        return done

    def start_mps(self) -> None:
        """NVIDIA MPS when the executor and the workers share a GPU (`launcher.mps`)."""
        plan, why = MpsDaemon.plan(self.service_env(), self.run_dir)
        if plan is None:
            if why:
                sys.stderr.write(f"[stack] not starting NVIDIA MPS: {why}\n")
            return
        try:
            plan.start(self.service_env())
        except (subprocess.SubprocessError, OSError) as exc:
            sys.stderr.write(f"[stack] NVIDIA MPS did not start ({exc}): going on without\n")
            return
        self.mps = plan
        sys.stderr.write(f"[stack] NVIDIA MPS started (pipes in {plan.pipe_dir})\n")

    def stop(self, timeout_s: float = 15) -> None:
        self._stop_services(timeout_s)
        if self.mps is not None:
            self.mps.stop(self.service_env())
            self.mps = None
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self.claim_fd is not None:  # only the stack that claimed the data dir owns them
            self._remove_sockets()
        self._let_go()

    def _let_go(self) -> None:  # the data dir's claim (`claim`), if this stack holds it
        if self.claim_fd is not None:
            release(self.claim_fd)
            self.claim_fd = None

    def _remove_sockets(self) -> None:
        """The stack's socket directory goes with it (sockets a killed service left, too)."""
        with contextlib.suppress(FileNotFoundError):
            for entry in self.run_dir.iterdir():
                if entry.is_socket() or entry.is_fifo():
                    entry.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.run_dir.rmdir()

    def _stop_services(self, timeout_s: float) -> None:
        for name in ("gateway", "manager", "executor"):
            service = self.services.get(name)
            if service is not None and service.alive():
                service.proc.send_signal(signal.SIGTERM)
                try:
                    service.proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    service.proc.kill()
                    service.proc.wait()

    def kill(self, name: str) -> None:  # one service, SIGKILL
        self.services[name].proc.kill()
        self.services[name].proc.wait()

    def kill_all(self) -> None:
        """SIGKILL every process of the stack, workers and trainers included (a crash)."""
        import psutil

        procs = []
        for service in self.services.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                parent = psutil.Process(service.proc.pid)
                procs += [parent, *parent.children(recursive=True)]
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(procs, timeout=10)
        for service in self.services.values():
            service.proc.wait()
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        self._let_go()  # as the kernel lets go of a launcher that died

    def _start(self, name: str, env: dict, timeout_s: float) -> Service:
        args, ready, fds = self._recipes[name]
        return self._spawn(name, args, env, ready, timeout_s, fds)

    def _spawn(self, name: str, args: list[str], env: dict, ready: Callable[[], bool],
               timeout_s: float, pass_fds: tuple[int, ...] = ()) -> Service:
        proc = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                text=True, errors="replace", pass_fds=pass_fds)
        service = Service(name, proc)
        self.services[name] = service

        def pump() -> None:
            for line in proc.stderr:
                service.log.append(line)
                if len(service.log) > 5000:
                    del service.log[:1000]
                if self.echo:
                    sys.stderr.write(f"[{name}] {line}")

        threading.Thread(target=pump, daemon=True, name=f"log-{name}").start()
        deadline = time.monotonic() + timeout_s
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                raise RuntimeError(f"{name} did not start:\n" + "".join(service.log[-40:]))
            time.sleep(0.1)
        return service

    def _http_ok(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False
