"""`symbiosis serve`, the README's main job: starts everything, prints a key, stops on Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import psutil
import pytest

from launcher.ports import free_port
from launcher.stack import Stack

pytestmark = pytest.mark.slow


def serve(data_dir: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launcher.cli", "serve", "--data-dir",
                             str(data_dir), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def banner(proc: subprocess.Popen) -> str:
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # logs: keep the pipe open
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "Ctrl-C" in line:
            break
    return "".join(lines)


def test_serve_prints_a_working_key_and_stops_cleanly(tmp_path, short_dir) -> None:
    port, run = free_port(), short_dir  # a runtime dir of its own: no other test's in it
    proc = serve(tmp_path / "data", "--port", str(port), env={"XDG_RUNTIME_DIR": str(run)})
    try:
        output = banner(proc)
        key = re.search(r"API key: (\S+)", output).group(1)
        assert (tmp_path / "data" / "dev.key").read_text().strip() == key
        assert oct((tmp_path / "data" / "dev.key").stat().st_mode & 0o777) == "0o600"
        assert "random weights" in output
        assert f"http://127.0.0.1:{port}/v1" in output
        assert "curl" in output
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key,
                               max_retries=0)
        out = client.completions.create(model="tiny-llama", prompt="Hello", max_tokens=5)
        assert out.usage.completion_tokens >= 1
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 4  # executor, manager, spawner, gateway (+ workers)
        assert key not in (tmp_path / "data" / "tenants.json").read_text()  # stored hashed
        # a second serve on the same data dir stops at once, and leaves this one's sockets be
        second = serve(tmp_path / "data", "--port", str(free_port()),
                       env={"XDG_RUNTIME_DIR": str(run)})
        out, err = second.communicate(timeout=60)
        assert (second.returncode, out) == (1, "") and "is serving the data dir" in err, err
        assert len(list((run / "symbiosis").rglob("executor.sock"))) == 1
        assert client.completions.create(model="tiny-llama", prompt="Hi", max_tokens=2).choices
    finally:
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert time.monotonic() - started < 30
    assert proc.returncode == 0
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left behind: {[p.pid for p in alive]}"
    assert not Stack(tmp_path / "data").run_dir.exists()  # no sockets left behind
    assert list((run / "symbiosis").iterdir()) == []  # the manager's workers dir, removed


def test_serve_refuses_a_port_in_use_before_printing_anything(tmp_path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = serve(tmp_path / "data", env={"SYMBIOSIS_PORT": str(port)})  # the env is read
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert out == ""  # no "serving", no key
    assert f"127.0.0.1:{port}" in err and "in use" in err
    assert not (tmp_path / "data" / "tenants.json").exists()


def test_serve_restarts_a_killed_executor(tmp_path) -> None:
    port = free_port()
    proc = serve(tmp_path / "data", "--port", str(port))
    try:
        key = re.search(r"API key: (\S+)", banner(proc)).group(1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key,
                               max_retries=0, timeout=60)
        assert client.completions.create(model="tiny-llama", prompt="Hi", max_tokens=2).choices
        services = {name: child(proc, module) for name, module in
                    (("executor", "executor"), ("gateway", "gateway"))}
        services["executor"].kill()
        killed = time.monotonic()
        with pytest.raises(openai.APIStatusError) as down:
            client.completions.create(model="tiny-llama", prompt="Hi", max_tokens=2)
        assert down.value.status_code == 503
        while True:
            assert time.monotonic() - killed < 15, "the executor did not come back in 15 s"
            try:
                out = client.completions.create(model="tiny-llama", prompt="Hi", max_tokens=2)
                break
            except openai.APIStatusError as exc:
                assert exc.status_code == 503
                time.sleep(0.25)
        assert out.usage.completion_tokens == 2
        assert child(proc, "gateway").pid == services["gateway"].pid  # not restarted
        assert child(proc, "executor").pid != services["executor"].pid
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


def child(proc: subprocess.Popen, module: str) -> psutil.Process:
    """The stack's child process running `python -m <module>`."""
    for candidate in psutil.Process(proc.pid).children():
        cmdline = candidate.cmdline()
        if "-m" in cmdline and cmdline[cmdline.index("-m") + 1] == module:
            return candidate
    raise LookupError(module)
