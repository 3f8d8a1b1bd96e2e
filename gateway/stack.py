"""Start and stop the whole system as host processes: executor, worker manager, gateway.

Used by `symbiosis serve` and by the end-to-end tests. Each child's stderr is relayed with a
prefix; each is started only after the previous one said it is ready.
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
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)

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
        # ipc:// paths are limited to ~100 bytes: a short directory keyed by the data dir
        digest = hashlib.sha1(str(self.data_dir.resolve()).encode()).hexdigest()[:10]
        return Path("/tmp") / f"symbiosis-{digest}"

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
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = self.service_env()
        try:
            self._spawn("executor", [sys.executable, "-m", "executor", "--model", self.model,
                                     "--bind", env["SYMBIOSIS_EXECUTOR"], *self.executor_args],
                        env, "executor ready", timeout_s)
            self._spawn("manager", [sys.executable, "-m", "workers.manager", "--executor",
                                    env["SYMBIOSIS_EXECUTOR"], "--model", self.model, "--bind",
                                    env["SYMBIOSIS_MANAGER"], *self.manager_args],
                        env, "worker manager ready", timeout_s)
            self._spawn("gateway", [sys.executable, "-m", "gateway"], env, "gateway ready",
                        timeout_s)
            self._wait_http(timeout_s)
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

    def _spawn(self, name: str, args: list[str], env: dict, ready_line: str,
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
                if ready_line in line:
                    service.ready.set()
                if self.echo:
                    sys.stderr.write(f"[{name}] {line}")

        threading.Thread(target=pump, daemon=True, name=f"log-{name}").start()
        deadline = time.monotonic() + timeout_s
        while not service.ready.wait(0.1):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n" + "".join(service.log[-40:]))
        return service

    def _wait_http(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("the gateway did not answer /health")
