"""One fine-tuning job in its own process: data, the remote model, the loop, checkpoints, events.

The job's stored spec says what to run (every default was resolved when the job was created).
This process writes events, checkpoints and the final status to the job store, and takes pause
and cancel from the worker manager between steps (`ControlChannel`). A job that was paused,
cancelled or interrupted continues from its latest checkpoint (adapter, optimizer, scheduler,
data position) when it runs again.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import tempfile
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel, get_peft_model

from catalogue.paths import local_path
from state.adapters import AdapterRegistry
from state.db import Database, db_path
from state.files import FileStore, file_sha256
from state.jobs import JobStore
from wire.jobs import JobAction
from wire.spawner import TrainerSpec
from workers.device import DeviceUnavailable, claim_device
from workers.remote.build import remote_model
from workers.remote.handle import ExecutorUnavailable
from workers.remote.privacy import PrivacyConfig
from workers.training import checkpoint, gates
from workers.training.control import ControlChannel
from workers.training.data import Example, InvalidTrainingFile, batches, load_examples
from workers.training.loop import Hyperparameters, evaluate, optimizer_for, train_step
from workers.training.methods import peft_config
from workers.training.priority import yield_to_inference

log = logging.getLogger("workers.trainer")


class JobStopped(Exception):
    pass


class Trainer:
    def __init__(self, config: TrainerSpec, tokenizer: Any) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.db = Database(db_path(self.data_dir))
        self.jobs = JobStore(self.db)
        self.files = FileStore(self.db, self.data_dir)
        self.tokenizer = tokenizer
        self.job = self.jobs.get(config.job_id)
        self.control = ControlChannel(None, config.job_id)
        self.stopped: str | None = None  # the status this process left the job in

    def run(self) -> int:
        job = self.job
        try:
            examples, valid = self._data()
        except InvalidTrainingFile as exc:
            return self._fail("invalid_training_file",
                              f"The job failed due to an invalid training file. {exc}",
                              "training_file")
        spec = job.spec
        hp = Hyperparameters(spec.n_epochs, spec.batch_size, spec.peft.learning_rate,
                             spec.peft.warmup_ratio, spec.peft.weight_decay)
        torch.set_num_threads(self.config.threads)
        try:
            device = claim_device(self.config.device)
        except DeviceUnavailable as exc:
            return self._fail("device_unavailable", f"The job could not start: {exc}")
        steps_per_epoch = math.ceil(len(examples) / hp.batch_size)
        total = hp.n_epochs * steps_per_epoch
        model = remote_model(self.config.base, self.config.executor,
                             client_name=f"trainer-{job.id}", device=str(device),
                             privacy=self.config.privacy and PrivacyConfig(backward=True))
        torch.manual_seed(job.seed)
        if spec.peft.init_adapter:  # continue from a fine-tuned model or a checkpoint
            model = PeftModel.from_pretrained(model, spec.peft.init_adapter, is_trainable=True,
                                              torch_device=str(device))
        else:
            model = get_peft_model(model, peft_config(spec.peft, total))
        optimizer, scheduler = optimizer_for(model, hp, total)
        root = checkpoint.checkpoint_root(self.data_dir, job.id)
        found = checkpoint.latest(root)
        progress = (checkpoint.restore(found, model, optimizer, scheduler) if found
                    else checkpoint.Progress())
        how = f"resumed at step {progress.step}" if found else "started"
        redone = self.jobs.forget_steps_after(job.id, progress.step)
        if redone:
            how += f" (the steps after it are redone; {redone} of their events dropped)"
        self.jobs.event(job.id, f"Fine-tuning job {how}: {len(examples)} examples, "
                                f"{hp.n_epochs} epoch(s), {total} steps")
        model.train()
        try:
            self._epochs(model, optimizer, scheduler, hp, examples, valid, progress, total)
            self._finish(model, progress, valid, hp)
        except JobStopped:
            pass
        finally:
            model.get_base_model().symbiosis_executor.close()
        return 0

    # -- phases ------------------------------------------------------------------------------

    def _data(self) -> tuple[list[Example], list[Example]]:
        max_len = self.job.spec.peft.max_seq_length
        train = self.files.get(self.job.training_file, self.job.tenant)
        examples = load_examples(train.path, self.tokenizer, max_len)
        valid: list[Example] = []
        if self.job.validation_file:
            record = self.files.get(self.job.validation_file, self.job.tenant)
            valid = load_examples(record.path, self.tokenizer, max_len)
        return examples, valid

    def _epochs(self, model, optimizer, scheduler, hp: Hyperparameters,
                examples: list[Example], valid: list[Example], progress, total: int) -> None:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None \
            else self.tokenizer.eos_token_id
        on_gradients = None
        if self.job.spec.peft.method == "adalora":  # AdaLoRA reallocates ranks as it trains
            def on_gradients() -> None:
                model.base_model.update_and_allocate(progress.step)
        root = checkpoint.checkpoint_root(self.data_dir, self.job.id)
        for epoch in range(progress.epoch, hp.n_epochs):
            order = batches(len(examples), hp.batch_size, self.job.seed, epoch)
            for position in range(progress.position, len(order)):
                self._check_control(model, optimizer, scheduler, progress, epoch, position)
                result = train_step(model, [examples[i] for i in order[position]], pad,
                                    optimizer, scheduler, hp, on_gradients)
                progress.step += 1
                progress.trained_tokens += result.tokens
                progress.history.append({"step": progress.step, "train_loss": result.loss,
                                         "train_accuracy": result.accuracy})
                self.jobs.event(self.job.id, f"Step {progress.step}/{total}: training "
                                f"loss={result.loss:.4f}", type="metrics",
                                data={"step": progress.step, "train_loss": result.loss,
                                      "train_mean_token_accuracy": result.accuracy,
                                      "epoch": epoch + 1,
                                      "trained_tokens": progress.trained_tokens})
                every = self.job.spec.peft.checkpoint_every_steps
                if every and progress.step % every == 0 and position + 1 < len(order):
                    progress.epoch, progress.position = epoch, position + 1  # resume point
                    path = checkpoint.save(root, model, optimizer, scheduler, progress)
                    self._register_checkpoint(path, progress, epoch + 1, {
                        "step": progress.step, "train_loss": result.loss,
                        "train_mean_token_accuracy": result.accuracy})
            progress.epoch, progress.position = epoch + 1, 0
            last = progress.history[-1]
            metrics = {"step": last["step"], "train_loss": last["train_loss"],
                       "train_mean_token_accuracy": last["train_accuracy"]}
            if valid:
                model.eval()
                metrics["valid_loss"], metrics["valid_mean_token_accuracy"] = evaluate(
                    model, valid, pad, hp.micro_batch_tokens)
                model.train()
                progress.history[-1].update(valid_loss=metrics["valid_loss"],
                                            valid_mean_token_accuracy=metrics[
                                                "valid_mean_token_accuracy"])
                self.jobs.event(self.job.id, f"Epoch {epoch + 1}/{hp.n_epochs}: validation "
                                f"loss={metrics['valid_loss']:.4f}", type="metrics",
                                data={"step": progress.step, **metrics,
                                      "trained_tokens": progress.trained_tokens})
            path = checkpoint.save(root, model, optimizer, scheduler, progress)
            self._register_checkpoint(path, progress, epoch + 1, metrics)

    def _check_control(self, model, optimizer, scheduler, progress, epoch: int,
                       position: int) -> None:
        action = self.control.requested()
        if action is None:
            return
        progress.epoch, progress.position = epoch, position
        checkpoint.save(checkpoint.checkpoint_root(self.data_dir, self.job.id), model, optimizer,
                        scheduler, progress)
        status = {JobAction.PAUSE: "paused", JobAction.PREEMPT: "queued"}.get(action,
                                                                           "cancelled")
        if self.jobs.move(self.job.id, status):
            self.jobs.event(self.job.id, f"Preempted by a job of higher priority at step "
                            f"{progress.step}; it will resume from this checkpoint"
                            if status == "queued" else
                            f"Job {status} at step {progress.step}; checkpoint saved")
        self.stopped = status
        raise JobStopped

    def _register_checkpoint(self, path: Path, progress, epoch: int, metrics: dict) -> None:
        model_id = f"{self.job.model_id}:ckpt-step-{progress.step}"
        registry = AdapterRegistry(self.db, self.data_dir, self.job.model,
                                   local_path(self.job.model))
        if registry.get(model_id) is None:
            registry.register(self.job.tenant, "", path, model_id=model_id,
                              origin="checkpoint", job_id=self.job.id)
        self.jobs.add_checkpoint(self.job.id, progress.step, epoch, model_id, metrics,
                                 str(path))
        self.jobs.event(self.job.id, f"Checkpoint created at step {progress.step}: {model_id}")

    def _finish(self, model, progress, valid: list[Example], hp: Hyperparameters) -> None:
        job = self.job
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None \
            else self.tokenizer.eos_token_id
        verdict = gates.check(model, self.tokenizer, progress.history, valid, pad,
                              hp.micro_batch_tokens, job.spec.peft.gates)
        for item in verdict["checks"]:
            self.jobs.event(job.id, f"Quality gate {item['name']}: "
                            f"{'passed' if item['passed'] else 'FAILED'} ({item['detail']})",
                            level="info" if item["passed"] else "warn")
        registry = AdapterRegistry(self.db, self.data_dir, job.model, local_path(job.model))
        passed, lineage = verdict["passed"], self._lineage(verdict)
        name = job.spec.peft.register_as
        with tempfile.TemporaryDirectory(dir=self.data_dir) as tmp:
            model.save_pretrained(tmp)
            if registry.get(job.model_id) is None:
                registry.register(job.tenant, "", Path(tmp), model_id=job.model_id,
                                  origin="fine-tune", job_id=job.id, in_service=passed,
                                  lineage=lineage)
            if name and not any(v.job_id == job.id for v in
                                registry.versions.list(f"{job.tenant}/{name}")):
                version = registry.register(job.tenant, name, Path(tmp), origin="fine-tune",
                                            job_id=job.id, in_service=passed, lineage=lineage)
                self.jobs.event(job.id, f"Registered as {version.id}" + (
                    ", now serving" if passed else
                    ", a candidate version (it failed a quality gate)"))
        results = self.files.create(job.tenant, f"{job.id}-results.csv", "fine-tune-results",
                                    _results_csv(progress.history))
        self.jobs.event(job.id, f"New fine-tuned model created: {job.model_id}" + (
            "" if verdict["passed"] else " (a candidate, not in service: it failed a quality "
            f"gate; POST /v1/adapters/{job.model_id}/promote serves it anyway)"),
            level="info" if verdict["passed"] else "warn")
        self.jobs.move(job.id, "succeeded", fine_tuned_model=job.model_id,
                       trained_tokens=progress.trained_tokens, result_files=[results.id],
                       gates=verdict)
        self.jobs.event(job.id, "The job has successfully completed")
        self.stopped = "succeeded"

    def _lineage(self, verdict: dict) -> dict:
        """Where a result came from: its data (with SHA-256s), settings and gate results."""
        job, lineage = self.job, {"job_id": self.job.id, "gates": verdict}
        for key in ("training_file", "validation_file"):
            file_id = getattr(job, key)
            record = self.files.get(file_id, job.tenant) if file_id else None
            lineage[key] = file_id
            if record is not None:
                lineage[f"{key}_sha256"] = file_sha256(record.path)
        lineage["hyperparameters"] = job.spec.hyperparameters()
        lineage["peft"] = {k: v for k, v in job.spec.peft_dict().items() if k != "init_adapter"}
        return lineage

    def _fail(self, code: str, message: str, param: str | None = None) -> int:
        if self.jobs.move(self.job.id, "failed",
                          error={"code": code, "message": message, "param": param}):
            self.jobs.event(self.job.id, message, level="error")
        self.stopped = "failed"
        return 0


def _results_csv(history: list[dict]) -> bytes:
    out = io.StringIO()
    columns = ["step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy"]
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for row in history:
        writer.writerow({k: row.get(k, "") for k in columns})
    return out.getvalue().encode()


def run(config: TrainerSpec, tokenizer: Any) -> int:
    """Process entry point. Returns non-zero when the job should be retried (it stays running
    in the database, so the scheduler requeues it)."""
    yield_to_inference()
    trainer = Trainer(config, tokenizer)
    if trainer.job is None or trainer.job.status != "running":
        return 0
    trainer.control = ControlChannel(config.manager, config.job_id)
    try:
        return trainer.run()
    except ExecutorUnavailable:
        log.exception("job %s lost the executor", config.job_id)
        trainer.jobs.event(config.job_id, "The executor is unavailable; the job will resume "
                           "from its latest checkpoint", level="warn")
        return 75
    except Exception as exc:
        log.exception("job %s failed", config.job_id)
        return trainer._fail("internal_error", f"The job failed: {type(exc).__name__}: {exc}")
    finally:
        if trainer.stopped is not None:
            trainer.control.stopped(trainer.stopped)
        trainer.control.close()
