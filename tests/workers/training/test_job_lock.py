"""One trainer per job at a time: a second holder of a job's lock waits until the first lets go
(or is stopping), a killed holder lets go with its process; and a trainer process started while
another holds its job waits, saying so, and starts only once it is free."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.workers.training.manager_stand_in import ManagerStandIn
from tests.workers.training.test_reports import MODEL, running_job, trainer_argv
from wire.jobs import TrainerEvent, TrainerStarted
from workers.training.job_lock import JobLock
from workers.training.runner import PREVIOUS_TRAINER, RETRY


def test_a_second_holder_waits_for_the_first_or_gives_up_when_stopping(tmp_path) -> None:
    first, second = JobLock(tmp_path, "ftjob-1"), JobLock(tmp_path, "ftjob-1")
    assert first.take(waiting=lambda: None, stopping=lambda: False)
    told, taken = [], threading.Event()
    waiter = threading.Thread(target=lambda: second.take(lambda: told.append(1), lambda: False)
                              and taken.set())
    waiter.start()
    time.sleep(0.6)
    assert told == [1] and not taken.is_set()  # told once, still waiting
    assert JobLock(tmp_path, "ftjob-2").take(lambda: None, lambda: False)  # another job's
    first.release()
    assert taken.wait(5) and told == [1]
    waiter.join()
    assert not JobLock(tmp_path, "ftjob-1").take(lambda: None, lambda: True)  # stopping
    second.release()


def test_a_killed_holder_lets_go_with_its_process(tmp_path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; "
        "from workers.training.job_lock import JobLock; "
        f"JobLock(Path({str(tmp_path)!r}), 'ftjob-1').take(lambda: None, lambda: False); "
        "print('held', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    lock = JobLock(tmp_path, "ftjob-1")
    assert not lock.take(lambda: None, lambda: True)  # held by the other process
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    assert lock.take(lambda: None, lambda: False)
    lock.release()


@pytest.mark.slow
def test_a_trainer_waits_for_its_jobs_previous_trainer(executor_for, tmp_path,
                                                       ipc_dir) -> None:
    manager = ManagerStandIn(tmp_path, ipc_dir)
    previous = JobLock(tmp_path, "")
    try:
        job_id = running_job(manager, 4, 1, "lock")
        previous = JobLock(tmp_path, job_id)  # the previous trainer, still stopping
        assert previous.take(lambda: None, lambda: False)
        argv = trainer_argv(manager.spec(job_id, executor_for(MODEL).endpoint))

        def waiting() -> bool:
            return any(isinstance(r, TrainerEvent) and r.message == PREVIOUS_TRAINER
                       for r in manager.reports)

        stopped = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not waiting():
            assert time.monotonic() < deadline and stopped.poll() is None, stopped.stderr.read()
            time.sleep(0.05)
        stopped.send_signal(signal.SIGTERM)  # the service stopping while it waits
        assert stopped.wait(30) == RETRY
        manager.reports.clear()
        second = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        while not waiting():
            assert time.monotonic() < deadline and second.poll() is None, second.stderr.read()
            time.sleep(0.05)
        time.sleep(1.0)
        assert not any(isinstance(r, TrainerStarted) for r in manager.reports)
        previous.release()
        assert second.wait(300) == 0, second.stderr.read()[-3000:]
        assert manager.jobs.get(job_id).status == "succeeded"
        assert any(isinstance(r, TrainerStarted) for r in manager.reports)
    finally:
        previous.release()
        manager.close()
