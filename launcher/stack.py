"""Start and stop the whole system as host processes: executor, worker manager, gateway.

Used by `symbiosis serve` and by the end-to-end tests. Each child's stderr is kept (and relayed
with a prefix when asked); each is started only once the previous one answers its own probe
(the executor and the manager a ping on their sockets, the gateway `/health`).
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

from wire.endpoints import private_dir, runtime_dir
from wire.probes import executor_answers, manager_answers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log: list[str] = field(default_factory=list)

    def alive(self) -> bool:
        return self.proc.poll() is None


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
        }

    def start(self, timeout_s: float = 300) -> Stack:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        private_dir(runtime_dir())
        private_dir(self.run_dir)
        env = self.service_env()
        try:
            self._spawn("executor", [sys.executable, "-m", "executor", "--model", self.model,
                                     "--bind", env["SYMBIOSIS_EXECUTOR"], *self.executor_args],
                        env, lambda: executor_answers(env["SYMBIOSIS_EXECUTOR"], 1000),
                        timeout_s)
            self._spawn("manager", [sys.executable, "-m", "workers.manager", "--executor",
                                    env["SYMBIOSIS_EXECUTOR"], "--model", self.model, "--bind",
                                    env["SYMBIOSIS_MANAGER"], *self.manager_args],
                        env, lambda: manager_answers(env["SYMBIOSIS_MANAGER"], 1000), timeout_s)
            self._spawn("gateway", [sys.executable, "-m", "gateway"], env, self._http_ok,
                        timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 15) -> None:
        for name in ("gateway", "manager", "executor"):
            service = self.services.get(name)
            if service is not None and service.alive():
                service.proc.send_signal(signal.SIGTERM)
                try:
                    service.proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    service.proc.kill()
                    service.proc.wait()

    def kill(self, name: str) -> None:
        self.services[name].proc.kill()
        self.services[name].proc.wait()

    def kill_all(self) -> None:
        """SIGKILL every process of the stack, workers and trainers included (a crash)."""
        import psutil

        procs = []
        for service in self.services.values():
            try:
                parent = psutil.Process(service.proc.pid)
                procs += [parent, *parent.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(procs, timeout=10)
        for service in self.services.values():
            service.proc.wait()

    def _spawn(self, name: str, args: list[str], env: dict, ready: Callable[[], bool],
               timeout_s: float) -> Service:
        proc = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                text=True, errors="replace")
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
                raise RuntimeError(f"{name} did not start:\n" + "".join(service.log[-40:]))
            time.sleep(0.1)
        return service

    def _http_ok(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False
