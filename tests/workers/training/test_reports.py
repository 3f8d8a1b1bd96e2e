"""The manager is the one writer of a job's state: a trainer reports on its control channel and
never opens the database (it runs here in a process where touching it is fatal)."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from gateway.job_spec import resolve
from openapi.fine_tuning import Hyperparameters
from state.jobs import new_id
from tests.workers.training.manager_stand_in import ManagerStandIn
from wire.jobs import (
    NewJob,
    TrainerCheckpoint,
    TrainerEvent,
    TrainerFinished,
    TrainerStarted,
    TrainerThreads,
)
from workers.manager.adapter_store import AdapterRegistry

MODEL = "tiny-llama"
DATA = Path(__file__).parents[2] / "data" / "gsm8k_train_prompt_completion_1000.jsonl"
DATABASE_MODULES = {"sqlite3", "state.db", "state.jobs", "state.files", "state.adapters",
                    "state.versions"}


def test_no_trainer_module_imports_the_database_or_the_job_store() -> None:
    root = Path(__file__).parents[3] / "workers" / "training"
    found = {}
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            found.update({f"{path.name}: {n}": n for n in names if n in DATABASE_MODULES})
    assert len(list(root.glob("*.py"))) >= 8 and not found, found


def running_job(manager: ManagerStandIn, lines: int, batch_size: int, suffix: str,
                **peft) -> str:
    """A job on the first `lines` examples, moved to running as the manager does before it
    spawns the trainer."""
    rows = DATA.read_text().splitlines()[:lines]
    upload = manager.files.create("acme", "train.jsonl", "fine-tune", "\n".join(rows).encode(),
                                  examples=len(rows))
    spec = resolve(Hyperparameters(n_epochs=1, batch_size=batch_size),
                   {"method": "lora", "r": 4, **peft}, len(rows), 0)
    job = manager.jobs.create(new_id("ftjob"), NewJob(
        tenant="acme", model=MODEL, training_file=upload.id, suffix=suffix, seed=7, spec=spec))
    assert manager.jobs.move(job.id, "queued") and manager.jobs.move(job.id, "running")
    return job.id


def trainer_argv(spec) -> list[str]:
    """The trainer in a process of its own that may not touch the database."""
    return [sys.executable, "-m", "tests.workers.training.trainer_process",
            msgspec.json.encode(spec).decode()]


@pytest.mark.slow
def test_a_trainer_that_cannot_open_the_database_runs_its_job_through_the_manager(
        executor_for, tmp_path, ipc_dir) -> None:
    manager = ManagerStandIn(tmp_path, ipc_dir)
    try:
        job_id = running_job(manager, 10, 2, "own", checkpoint_every_steps=2)
        run = subprocess.run(trainer_argv(manager.spec(job_id, executor_for(MODEL).endpoint)),
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        done = manager.jobs.get(job_id)
        assert done.status == "succeeded", done.error
        kinds = [type(r) for r in manager.reports]
        assert kinds[0] is TrainerStarted and kinds[-1] is TrainerFinished
        assert kinds.count(TrainerCheckpoint) == 3  # steps 2 and 4, and the epoch's end (5)
        steps = [r.data["step"] for r in manager.reports
                 if isinstance(r, TrainerEvent) and r.kind == "metrics"]
        assert steps == [1, 2, 3, 4, 5]
        events = [e["message"] for e in manager.jobs.events(job_id, after=None, limit=100)[0]]
        assert "Checkpoint created at step 4: " + done.model_id + ":ckpt-step-4" in events
        assert events[0] == "The job has successfully completed"  # newest first
        checkpoints, _ = manager.jobs.checkpoints(job_id, limit=10)
        assert sorted(c["step_number"] for c in checkpoints) == [2, 4, 5]
        adapter = AdapterRegistry(manager.jobs.db, tmp_path, MODEL).get(done.fine_tuned_model)
        assert (Path(adapter.path) / "adapter_model.safetensors").is_file()
        results = manager.files.get(done.result_files[0], "acme")
        lines = Path(results.path).read_text().splitlines()
        assert lines[0].startswith("step,train_loss") and len(lines) == 6
        assert not (tmp_path / "jobs" / job_id / "result").exists()  # the copy was kept
        finished = manager.reports[-1]
        assert done.gates == finished.gates and done.trained_tokens == finished.trained_tokens
        assert adapter.in_service == finished.gates["passed"]
    finally:
        manager.close()


@pytest.mark.slow
def test_sigterm_stops_a_trainer_at_a_step_with_a_checkpoint_it_resumes_from(
        executor_for, tmp_path, ipc_dir) -> None:
    """The service stopping (its spawner sends SIGTERM) loses no step: the trainer ends the step
    it is in, saves a checkpoint, reports it and exits for a retry; run again, it resumes there
    and finishes with every step counted once. A listed checkpoint whose report never reached
    the manager (step 2's here) is told again by the resuming trainer and listed once."""
    manager = ManagerStandIn(tmp_path, ipc_dir)
    try:
        job_id = running_job(manager, 40, 1, "term", checkpoint_every_steps=2)
        manager.unheard = lambda report: isinstance(report, TrainerCheckpoint) and \
            report.step == 2
        argv = trainer_argv(manager.spec(job_id, executor_for(MODEL).endpoint))
        first = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while not any(isinstance(r, TrainerEvent) and r.kind == "metrics" and r.data["step"] >= 3
                      for r in manager.reports):
            assert time.monotonic() < deadline and first.poll() is None, first.stderr.read()
            time.sleep(0.02)
        first.send_signal(signal.SIGTERM)
        assert first.wait(60) == 75, first.stderr.read()[-3000:]  # RETRY: the job stays running
        while not (stopped := [r.message for r in manager.reports if isinstance(r, TrainerEvent)
                               and r.message.startswith("The service is stopping")]):
            assert time.monotonic() < deadline  # sent before the exit, read by the stand-in's
            time.sleep(0.02)  # thread: it may come a moment after
        at = int(stopped[0].split("at step ")[1].split(";")[0])
        done_steps = [r.data["step"] for r in manager.reports
                      if isinstance(r, TrainerEvent) and r.kind == "metrics"]
        assert at == done_steps[-1] >= 3 and at < 40  # stopped between steps, mid-epoch
        assert (tmp_path / "jobs" / job_id / "checkpoints" / f"step-{at}").is_dir()
        assert [c["step_number"] for c in manager.jobs.checkpoints(job_id, limit=50)[0]] == \
            list(range(at - at % 2, 2, -2))  # 2's report unheard
        manager.unheard = lambda report: False
        second = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        assert second.returncode == 0, second.stderr[-3000:]
        done = manager.jobs.get(job_id)
        assert done.status == "succeeded", done.error
        events = [e["message"] for e in manager.jobs.events(job_id, after=None, limit=200)[0]]
        assert any(f"resumed at step {at}" in m for m in events), events[:5]
        steps = [r.data["step"] for r in manager.reports
                 if isinstance(r, TrainerEvent) and r.kind == "metrics"]
        assert sorted(set(steps)) == list(range(1, 41)) and steps[len(done_steps)] == at + 1
        listed = [c["step_number"] for c in manager.jobs.checkpoints(job_id, limit=50)[0]]
        assert listed == list(range(40, 0, -2))  # each once, 2 among them
    finally:
        manager.close()


@pytest.mark.slow
def test_a_trainer_stopped_before_its_first_step_saves_no_checkpoint(
        executor_for, tmp_path, ipc_dir) -> None:
    """SIGTERM while the trainer loads its data or builds its model: nothing new to keep, so
    it exits for a retry without a checkpoint (a step-0 one was written before)."""
    from transformers import AutoTokenizer

    from catalogue.resolve import resolve_model
    from workers.training import checkpoint
    from workers.training.control import ControlChannel
    from workers.training.runner import RETRY, Trainer

    manager = ManagerStandIn(tmp_path, ipc_dir)
    control = None
    try:
        job_id = running_job(manager, 4, 1, "early")
        spec = manager.spec(job_id, executor_for(MODEL).endpoint)
        control = ControlChannel(spec.manager, job_id)
        control.stopping = True  # as SIGTERM leaves it, before the first step's start
        trainer = Trainer(spec, AutoTokenizer.from_pretrained(resolve_model(MODEL)), control)
        assert trainer.run() == RETRY
        assert checkpoint.latest(checkpoint.checkpoint_root(tmp_path, job_id)) is None
        deadline = time.monotonic() + 30
        while not any(isinstance(r, TrainerEvent) and "before this run's first step; the job "
                      "resumes from step 0" in r.message for r in manager.reports):
            assert time.monotonic() < deadline, manager.reports
            time.sleep(0.02)
    finally:
        if control is not None:
            control.close()
        manager.close()


@pytest.mark.slow
def test_a_private_trainer_ends_its_job_once(executor_for, tmp_path, ipc_dir) -> None:
    """Privacy mode wraps the executor handle; the trainer's closing of it at the end must reach
    the real connection (it raised there, after the job's success, and reported a failure)."""
    manager = ManagerStandIn(tmp_path, ipc_dir)
    try:
        job_id = running_job(manager, 4, 2, "private")
        private = msgspec.structs.replace(manager.spec(job_id, executor_for(MODEL).endpoint),
                                          privacy=True)
        run = subprocess.run(trainer_argv(private), capture_output=True, text=True, timeout=600)
        assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
        assert manager.jobs.get(job_id).status == "succeeded"
        last = [type(r).__name__ for r in manager.reports if type(r).__name__ in
                ("TrainerFinished", "TrainerStopped")]
        assert last == ["TrainerFinished"], last  # no failure reported after the success
    finally:
        manager.close()


def test_a_trainer_steps_on_the_threads_the_manager_gave_it(executor_for, tmp_path,
                                                             ipc_dir) -> None:
    """Spawned on one thread, told two when it said hello (as when another job ended): its step
    of four examples (more than `TOKENS_PER_THREAD` tokens a thread) runs on two."""
    import torch
    from transformers import AutoTokenizer

    from catalogue.resolve import resolve_model
    from workers.threads import TOKENS_PER_THREAD
    from workers.training.control import ControlChannel
    from workers.training.runner import Trainer

    manager, before, control = ManagerStandIn(tmp_path, ipc_dir), torch.get_num_threads(), None
    try:
        job_id = running_job(manager, 4, 4, "threads")
        spec = manager.spec(job_id, executor_for(MODEL).endpoint)
        assert spec.threads == 1
        manager.greeting.append(TrainerThreads(job_id, 2))
        control = ControlChannel(spec.manager, job_id)
        deadline = time.monotonic() + 30
        while control.requested() is None and control.threads is None:
            assert time.monotonic() < deadline, "the stand-in's greeting never came"
            time.sleep(0.01)
        trainer = Trainer(spec, AutoTokenizer.from_pretrained(resolve_model(MODEL)), control)
        assert sum(len(e.ids) for e in trainer._data()[0]) >= 2 * TOKENS_PER_THREAD
        assert trainer.run() == 0 and manager.jobs.get(job_id).status == "succeeded"
        assert torch.get_num_threads() == 2  # set to the spec's 1 first, then told 2
    finally:
        torch.set_num_threads(before)
        if control is not None:
            control.close()
        manager.close()
