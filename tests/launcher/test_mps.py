"""The stack starts NVIDIA MPS when the executor and the workers share a GPU: only then, never
beside a daemon that already serves, and with the services told where its pipes are. The real
`nvidia-cuda-mps-control` exists only on GPU hosts; here a stand-in on PATH records how it is
called (its arguments, its input and the directories it is given)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from launcher.mps import MpsDaemon, on_one_gpu
from launcher.stack import Stack

GPU = {"SYMBIOSIS_EXECUTOR_DEVICE": "cuda:0", "SYMBIOSIS_WORKER_DEVICE": "cuda"}


@pytest.fixture()
def control(tmp_path: Path) -> Path:
    return stand_in_control(tmp_path)


def stand_in_control(tmp_path: Path) -> Path:
    """A stand-in control binary in its own PATH directory; it appends each call to calls.jsonl
    and, like the real daemon, has a `control` socket in its pipe directory while it serves."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-cuda-mps-control"
    script.write_text(
        "#!/usr/bin/env python3\n"
        "import json, os, sys\n"
        "stdin = '' if sys.stdin.isatty() or '-d' in sys.argv else sys.stdin.read()\n"
        f"with open({str(tmp_path / 'calls.jsonl')!r}, 'a') as f:\n"
        "    f.write(json.dumps({'args': sys.argv[1:], 'stdin': stdin,\n"
        "        'pipe': os.environ.get('CUDA_MPS_PIPE_DIRECTORY'),\n"
        "        'log': os.environ.get('CUDA_MPS_LOG_DIRECTORY')}) + '\\n')\n"
        "pipe = os.environ.get('CUDA_MPS_PIPE_DIRECTORY')\n"
        "if pipe and '-d' in sys.argv:\n"  # serving from now on, as the real daemon's socket
        "    os.makedirs(pipe, exist_ok=True); open(os.path.join(pipe, 'control'), 'w').close()\n"
        "elif pipe and 'quit' in stdin and os.path.exists(os.path.join(pipe, 'control')):\n"
        "    os.remove(os.path.join(pipe, 'control'))\n")
    script.chmod(0o755)
    return bin_dir


def calls(tmp_path: Path) -> list[dict]:
    path = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_only_an_executor_and_workers_both_on_a_gpu_want_mps() -> None:
    assert on_one_gpu(GPU)
    assert not on_one_gpu({**GPU, "SYMBIOSIS_WORKER_DEVICE": "cpu"})
    assert not on_one_gpu({"SYMBIOSIS_EXECUTOR_DEVICE": "cuda"})


def test_no_daemon_is_planned_off_a_gpu_when_off_beside_another_or_without_the_binary(
        tmp_path: Path, control: Path) -> None:
    path = f"{control}{os.pathsep}{os.environ['PATH']}"
    pipes = tmp_path / "pipes"
    env = {**GPU, "PATH": path, "CUDA_MPS_PIPE_DIRECTORY": str(pipes)}
    assert MpsDaemon.plan({**env, "SYMBIOSIS_EXECUTOR_DEVICE": "cpu"}, tmp_path) == (None, "")
    assert MpsDaemon.plan({**env, "SYMBIOSIS_MPS": "off"}, tmp_path) == \
        (None, "SYMBIOSIS_MPS is off")
    plan, why = MpsDaemon.plan({**env, "PATH": str(tmp_path / "empty")}, tmp_path)
    assert plan is None and "no nvidia-cuda-mps-control" in why
    pipes.mkdir()
    (pipes / "control").touch()  # an operator's daemon serves there
    plan, why = MpsDaemon.plan(env, tmp_path)
    assert plan is None and "already serves" in why


def test_the_daemon_starts_with_its_directories_and_quits(tmp_path: Path, control: Path) -> None:
    env = {**GPU, "PATH": f"{control}{os.pathsep}{os.environ['PATH']}",
           "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipes")}
    plan, _ = MpsDaemon.plan(env, tmp_path / "run")
    assert plan is not None and plan.control == str(control / "nvidia-cuda-mps-control")
    plan.start(env)
    plan.stop(env)
    plan.stop(env)  # once only
    expected = {"pipe": str(tmp_path / "pipes"), "log": str(tmp_path / "run" / "mps-log")}
    assert calls(tmp_path) == [{"args": ["-d"], "stdin": "", **expected},
                               {"args": [], "stdin": "quit\n", **expected}]
    assert (tmp_path / "run" / "mps-log").is_dir()


def test_the_services_are_told_where_the_stacks_daemon_is(tmp_path: Path, control: Path,
                                                          monkeypatch) -> None:
    monkeypatch.delenv("CUDA_MPS_LOG_DIRECTORY", raising=False)  # the host's, if it has one
    stack = Stack(tmp_path / "data", env={**GPU, "PATH": f"{control}{os.pathsep}"
                                          f"{os.environ['PATH']}",
                                          "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipes")})
    ours = str(stack.run_dir / "mps-log")
    assert stack.service_env().get("CUDA_MPS_LOG_DIRECTORY") != ours
    stack.start_mps()
    assert stack.mps is not None and stack.mps.started
    assert stack.service_env()["CUDA_MPS_LOG_DIRECTORY"] == ours
    stack.stop()
    assert stack.mps is None and [c["args"] for c in calls(tmp_path)] == [["-d"], []]
    shutil.rmtree(stack.run_dir, ignore_errors=True)
