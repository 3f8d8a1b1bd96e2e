"""The README's walk-through, as written: `symbiosis serve` in a fresh directory, then the
walk-through's shell commands and its Python, each step run as the README shows it (the port
aside), against the real stack. 0 failures, and the steps did what the README says."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from launcher.ports import free_port

pytestmark = pytest.mark.slow
README = (Path(__file__).parents[2] / "README.md").read_text()


def _blocks() -> tuple[str, str]:
    section = README[README.index("## Walk-through"):]
    section = section[:section.index("\n---\n")]
    shell = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    python = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return shell, python


def test_the_readme_walk_through_runs_as_written(tmp_path) -> None:
    shell, python = _blocks()
    port = free_port()
    shell, python = (block.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
                     for block in (shell, python))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    server = subprocess.Popen(["symbiosis", "serve", "--port", str(port)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "serve did not start"
            time.sleep(0.5)
        steps = subprocess.run(["bash", "-euo", "pipefail", "-c", shell], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=300)
        assert steps.returncode == 0, steps.stdout + steps.stderr
        assert "registered dev/helper@1" in steps.stdout
        run = subprocess.run([sys.executable, "-c", python], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout + run.stderr
        lines = run.stdout.splitlines()
        assert any(line.startswith("succeeded ft:tiny-llama:dev:helper:") for line in lines)
        rolled, promoted = lines[-2], lines[-1]
        assert "'version': 1" in rolled and "'weight': 100" in rolled, rolled
        assert "'version': 2" in promoted, promoted
        dashboard = httpx.get(f"http://127.0.0.1:{port}/dashboard", timeout=10)
        assert dashboard.status_code == 200
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
