"""A benchmark's executor process leaves nothing behind once stopped (its socket's directory)."""

from __future__ import annotations

from bench.executors import ExecutorProcess


def test_a_stopped_executor_leaves_no_directory_behind() -> None:
    executor = ExecutorProcess("tiny-llama", "opportunistic", 1, "float32")
    try:
        assert executor.directory.is_dir()
        assert executor.endpoint == f"ipc://{executor.directory / 'executor.sock'}"
    finally:
        executor.stop()
    assert executor.proc.returncode is not None and not executor.directory.exists()
