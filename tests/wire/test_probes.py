"""The readiness probes: an answer from a real executor, and a prompt "no" where nobody listens
(the launcher and the tests poll them while a service starts; one that never binds, e.g. an
executor that failed to load its model, must not hang them)."""

from __future__ import annotations

import threading
import time

import pytest

from tests.helpers import ExecutorProcess
from wire.probes import executor_answers, manager_answers


@pytest.mark.parametrize("probe", [executor_answers, manager_answers])
def test_a_probe_where_nobody_listens_says_no_within_its_timeout(short_dir, probe) -> None:
    answers: list[bool] = []
    asking = threading.Thread(target=lambda: answers.append(
        probe(f"ipc://{short_dir}/nobody.sock", timeout_ms=300)), daemon=True)
    started = time.monotonic()
    asking.start()
    asking.join(10.0)  # a plain send waited for a peer forever
    assert answers == [False] and time.monotonic() - started < 4.0


def test_a_probe_of_a_running_executor_says_yes(short_dir) -> None:
    executor = ExecutorProcess.start("tiny-llama", short_dir / "executor.sock")
    try:
        assert executor_answers(executor.endpoint, timeout_ms=2000) is True
        assert manager_answers(executor.endpoint, timeout_ms=500) is False  # no manager there
    finally:
        executor.stop()
