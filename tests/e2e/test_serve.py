"""`symbiosis serve`, the README's main job: starts everything, prints a key, stops on Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import openai
import psutil
import pytest

from launcher.stack import free_port

pytestmark = pytest.mark.slow


def test_serve_prints_a_working_key_and_stops_cleanly(tmp_path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "serve", "--data-dir",
                             str(tmp_path / "data"), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C" in line:
                break
        output = "".join(lines)
        key = re.search(r"API key \(shown once\): (\S+)", output).group(1)
        assert f"http://127.0.0.1:{port}/v1" in output
        assert "curl" in output
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key,
                               max_retries=0)
        out = client.completions.create(model="tiny-llama", prompt="Hello", max_tokens=5)
        assert out.usage.completion_tokens >= 1
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 4  # executor, manager, spawner, gateway (+ workers)
        assert key not in (tmp_path / "data" / "tenants.json").read_text()  # stored hashed
    finally:
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert time.monotonic() - started < 30
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left behind: {[p.pid for p in alive]}"
