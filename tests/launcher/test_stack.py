"""The launcher's supervisor: a service that keeps dying is restarted after growing delays."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import time

from launcher.stack import BACKOFF_S, Service, Stack


def test_a_service_that_keeps_dying_is_retried_with_growing_delays(tmp_path) -> None:
    stack = Stack(tmp_path / "data")
    dies = [sys.executable, "-c", "raise SystemExit(3)"]
    stack._recipes = {"executor": (dies, lambda: False, ())}  # never becomes ready
    first = subprocess.Popen(dies)
    first.wait()
    stack.services["executor"] = Service("executor", first)
    started, events = time.monotonic(), []
    while time.monotonic() - started < 4.5:
        events += [(time.monotonic(), line) for line in stack.supervise(timeout_s=5)]
        time.sleep(0.05)
    delays = [float(m.group(1)) for _, line in events
              if (m := re.search(r"restarting in ([\d.]+) s", line))]
    assert delays[:3] == list(BACKOFF_S[:3])  # 0.5, 1, 2: doubling
    tries = [at for at, line in events if "did not come back" in line]
    assert len(tries) >= 2
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert all(gap >= delay for gap, delay in zip(gaps, delays[1:], strict=False))
    assert all("code 3" in line for _, line in events if "exited" in line)


def test_idle_training_gives_the_jobs_an_executor_of_their_own(tmp_path, monkeypatch) -> None:
    from workers.manager.config import ManagerConfig

    for variable in ("SYMBIOSIS_IDLE_TRAINING", "SYMBIOSIS_EXECUTOR_DEVICE",
                     "SYMBIOSIS_EXECUTOR_SHARDS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("SYMBIOSIS_TRAINING_EXECUTOR", "ipc:///elsewhere")  # the stack's own wins
    off = {"SYMBIOSIS_IDLE_TRAINING": "false"}
    assert Stack(tmp_path, env=off).service_env()["SYMBIOSIS_TRAINING_EXECUTOR"] == ""
    sharded = Stack(tmp_path, executor_args=("--shards", "2"))  # a group has no twin
    assert sharded.service_env()["SYMBIOSIS_TRAINING_EXECUTOR"] == ""
    env = Stack(tmp_path).service_env()  # the default: a CPU executor of one shard has one
    assert env["SYMBIOSIS_TRAINING_EXECUTOR"] == \
        f"ipc://{Stack(tmp_path).run_dir}/training-executor.sock"
    for variable in ("SYMBIOSIS_EXECUTOR", "SYMBIOSIS_TRAINING_EXECUTOR"):
        monkeypatch.setenv(variable, env[variable])
    config = ManagerConfig()
    assert (config.executor, config.training_executor) == \
        (env["SYMBIOSIS_EXECUTOR"], env["SYMBIOSIS_TRAINING_EXECUTOR"])
