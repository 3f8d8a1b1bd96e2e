"""NVIDIA MPS for a stack whose executor and workers share a GPU.

Processes on one GPU otherwise take turns on it: every hand-over between a worker and the
executor costs a context switch (~350 us on an H100); under MPS they share it and a round trip
through a device buffer takes ~100-160 us (`../shared/reference/gpu-facts.md`). So when both the
executor and the workers are on a GPU the stack starts the MPS control daemon before the
executor and stops it after the services, unless one already serves (its pipe directory has a
control socket: an operator's daemon is used as it is). `SYMBIOSIS_MPS=off` leaves MPS alone;
a host without `nvidia-cuda-mps-control` goes on without it, saying why.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PIPE_DIR = Path("/tmp/nvidia-mps")  # the driver's default, where clients look


def pipe_dir(env: Mapping[str, str]) -> Path:
    return Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)


def serving(env: Mapping[str, str]) -> bool:
    """Whether a daemon already serves where these processes would look for one."""
    return (pipe_dir(env) / "control").exists()


def on_one_gpu(env: Mapping[str, str]) -> bool:
    """Whether the executor and the workers would both run on a GPU."""
    return all(env.get(name, "cpu").startswith("cuda")
               for name in ("SYMBIOSIS_EXECUTOR_DEVICE", "SYMBIOSIS_WORKER_DEVICE"))


@dataclass
class MpsDaemon:
    control: str  # the nvidia-cuda-mps-control binary
    pipe_dir: Path
    log_dir: Path
    started: bool = False

    @classmethod
    def plan(cls, env: Mapping[str, str], run_dir: Path) -> tuple[MpsDaemon | None, str]:
        """The daemon the stack should start for services with this environment, or None and
        why not (nothing to say when they are not both on a GPU)."""
        if not on_one_gpu(env):
            return None, ""
        if env.get("SYMBIOSIS_MPS", "auto").lower() in ("off", "0", "false", "no"):
            return None, "SYMBIOSIS_MPS is off"
        if serving(env):
            return None, f"an MPS daemon already serves {pipe_dir(env)}"
        control = shutil.which("nvidia-cuda-mps-control", path=env.get("PATH"))
        if control is None:
            return None, ("no nvidia-cuda-mps-control on this host: every hand-over between "
                          "processes on the GPU pays a context switch")
        log_dir = Path(env.get("CUDA_MPS_LOG_DIRECTORY") or run_dir / "mps-log")
        return cls(control, pipe_dir(env), log_dir), ""

    def env(self) -> dict[str, str]:
        """What the services need to find this daemon."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def start(self, env: Mapping[str, str]) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([self.control, "-d"], env={**env, **self.env()}, check=True, timeout=30,
                       capture_output=True)
        self.started = True

    def stop(self, env: Mapping[str, str]) -> None:
        """Ask the daemon to quit (it waits for its clients, which have stopped by now)."""
        if self.started:
            subprocess.run([self.control], input="quit\n", text=True, env={**env, **self.env()},
                           timeout=30, check=False, capture_output=True)
            self.started = False
