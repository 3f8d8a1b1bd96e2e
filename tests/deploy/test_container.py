"""A real container run: build the image, `compose up --wait`, a completion and a short
fine-tuning job through the published port, `compose down`.

Podman (with runc) serves the Docker API to the official Compose v2 binary. There is no image
registry here, so the base image is a debootstrap'ed Debian bookworm, and the build installs from
a local wheelhouse. Podman 4.3 runs no healthchecks without systemd: the test runs them while
`up --wait` waits. Traffic stays on loopback (host networking override). Under CI, missing
prerequisites fail the test; elsewhere they skip it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest

from launcher.ports import free_port
from tests.deploy.test_compose import compose_binary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # ~5 min here from a clean store
ROOT = Path(__file__).parents[2]
BASE = "localhost/symbiosis-base:bookworm"
IMAGE = "localhost/symbiosis:test"
PROJECT = "symbiosis-test"
CONF = """[containers]
default_ulimits = ["nofile=16384:16384", "nproc=16384:16384"]
[engine]
runtime = "runc"
"""


def prerequisites() -> str | None:
    for tool in ("podman", "runc", "debootstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install podman runc debootstrap)"
    return None


def sh(*args: str, env: dict | None = None, timeout: float = 900, **kw) -> str:
    started = time.monotonic()
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **(env or {})}, **kw)
    assert out.returncode == 0, f"{' '.join(args)} failed:\n{out.stdout[-2000:]}\n" \
                                f"{out.stderr[-4000:]}"
    print(f"[{time.monotonic() - started:6.1f} s] {' '.join(args[:3])}", flush=True)
    return out.stdout


def base_image(env: dict, work: Path) -> None:
    if subprocess.run(["podman", "image", "exists", BASE], env=env).returncode == 0:
        return
    rootfs = work / "rootfs"
    sh("debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
       "bookworm", str(rootfs), timeout=1200)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    sh("podman", "import", "-", BASE, env=env, stdin=tar.stdout)
    tar.wait()


def wheelhouse(wheels: Path) -> None:
    """Our wheel and every dependency's, resolved together with torch pinned to the CPU build
    (resolved alone, `torch>=2.4` would pull the newest CUDA torch and gigabytes of nvidia-*),
    the rest at the versions CI installs (.ci/constraints.txt)."""
    sh(sys.executable, "-m", "pip", "wheel", "-q", "-w", str(wheels), "-c",
       str(ROOT / ".ci" / "constraints.txt"), "torch==2.13.0", str(ROOT))
    cuda = [w.name for w in wheels.glob("*.whl") if w.name.startswith(("nvidia", "triton"))]
    assert not cuda, f"CUDA wheels in the wheelhouse: {cuda}"


def host_override(port: int) -> str:
    """Host networking (test traffic on loopback), so endpoints become 127.0.0.1."""
    common = f"""    network_mode: host
    image: {IMAGE}
    ports: !reset []
    environment:
      SYMBIOSIS_EXECUTOR: tcp://127.0.0.1:5555
      SYMBIOSIS_MANAGER: tcp://127.0.0.1:5556
      SYMBIOSIS_API_KEYS: acme=sk-container
      SYMBIOSIS_MAX_JOBS: "1"
"""
    return f"""services:
  executor:
{common}  workers:
{common}  gateway:
{common}    command: ["python", "-m", "gateway", "--host", "127.0.0.1", "--port", "{port}"]
    healthcheck:
      test: ["CMD-SHELL", "python -m gateway.healthcheck http://127.0.0.1:{port}/ready"]
"""


def healthchecks(env: dict, stop: threading.Event) -> None:
    """Podman 4.3 without systemd never runs healthchecks by itself."""
    while not stop.wait(2):
        names = subprocess.run(["podman", "ps", "--filter", f"label=com.docker.compose.project="
                                f"{PROJECT}", "--format", "{{.Names}}"], capture_output=True,
                               text=True, env=env).stdout.split()
        for name in names:
            subprocess.run(["podman", "healthcheck", "run", name], capture_output=True, env=env)


def test_compose_up_serves_and_fine_tunes(tmp_path) -> None:
    missing = prerequisites()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"container test prerequisites missing under CI: {missing}")
        pytest.skip(missing)
    conf = tmp_path / "containers.conf"
    conf.write_text(CONF)
    sock = tmp_path / "podman.sock"
    env = {"CONTAINERS_CONF": str(conf), "DOCKER_HOST": f"unix://{sock}",
           "DOCKER_BUILDKIT": "0", "COMPOSE_BAKE": "false"}
    service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{sock}"],
                               env={**os.environ, **env})
    port = free_port()
    override = tmp_path / "compose.test.yaml"
    override.write_text(host_override(port))
    compose = [str(compose_binary()), "-p", PROJECT, "-f", str(ROOT / "compose.yaml"),
               "-f", str(override)]
    stop = threading.Event()
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert time.monotonic() < deadline, "podman system service did not start"
            time.sleep(0.2)
        base_image(env, tmp_path)
        wheelhouse(ROOT / "wheels")
        sh(*compose, "build", env={**env, "SYMBIOSIS_BASE_IMAGE": BASE,
                                   "SYMBIOSIS_IMAGE": IMAGE}, cwd=ROOT, timeout=1800)
        threading.Thread(target=healthchecks, args=(env, stop), daemon=True).start()
        sh(*compose, "up", "-d", "--wait", "--wait-timeout", "600", env=env, cwd=ROOT,
           timeout=900)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-container",
                               max_retries=0, timeout=120)
        out = client.completions.create(model="tiny-llama", prompt="Hello", max_tokens=4)
        assert out.usage.completion_tokens >= 1
        rows = [json.dumps({"prompt": f"Question {i}?", "completion": " Answer."})
                for i in range(10)]
        upload = client.files.create(file=("t.jsonl", "\n".join(rows).encode()),
                                     purpose="fine-tune")
        job = client.fine_tuning.jobs.create(model="tiny-llama", training_file=upload.id,
                                             hyperparameters={"n_epochs": 1, "batch_size": 5})
        deadline = time.monotonic() + 300
        while job.status not in ("succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline, f"job still {job.status}"
            time.sleep(1)
            job = client.fine_tuning.jobs.retrieve(job.id)
        assert job.status == "succeeded", job.error
        assert client.completions.create(model=job.fine_tuned_model, prompt="Question 1?",
                                         max_tokens=2).choices
    finally:
        stop.set()
        subprocess.run([*compose, "down", "-v", "--timeout", "10"], env={**os.environ, **env},
                       cwd=ROOT, capture_output=True, timeout=300)
        service.terminate()
        service.wait(30)
