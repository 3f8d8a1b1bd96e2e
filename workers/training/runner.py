"""One fine-tuning job in its own process: data, the remote model, the loop, checkpoints.

The manager gives it the job (`TrainerJob`: the stored spec, every default resolved when the job
was created, and its files' paths); it reports what the job did to the manager on its control
channel (`ControlChannel`), which records it, and takes pause and cancel from there between
steps. It never opens the database. A job that was paused, cancelled or interrupted continues
from its latest checkpoint (adapter, optimizer, scheduler, data position) when it runs again.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel, get_peft_model

from wire.jobs import (
    JobStatus,
    TrainerCheckpoint,
    TrainerEvent,
    TrainerFinished,
    TrainerStarted,
    TrainerStopped,
)
from wire.spawner import TrainerSpec
from workers.device import DeviceUnavailable, claim_device
from workers.remote.build import remote_model
from workers.remote.handle import ExecutorUnavailable
from workers.remote.layers import BaseWeightUnavailable
from workers.remote.privacy import PrivacyConfig
from workers.threads import step_threads, use_threads
from workers.training import checkpoint, gates
from workers.training.control import ControlChannel
from workers.training.data import InvalidTrainingFile, Items, batches, existing, load_examples
from workers.training.job_lock import JobLock
from workers.training.lineage import lineage
from workers.training.loop import Hyperparameters, optimizer_for
from workers.training.methods import keep_for_backward, peft_config
from workers.training.preference import objective
from workers.training.process import run_as_trainer
from workers.training.stops import RETRY, JobStopped, service_stopping, stopped

log = logging.getLogger("workers.trainer")
RECOMPUTED = ", layers recomputed in the backward"
PREVIOUS_TRAINER = "Waiting for this job's previous trainer to stop"


class Trainer:
    def __init__(self, config: TrainerSpec, tokenizer: Any, control: ControlChannel) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.tokenizer = tokenizer
        self.job = config.job
        self.spec = config.job.spec
        self.objective = objective(self.spec.beta)  # supervised or DPO
        self.control = control
        self.resumed_at = 0  # the step this run began from (its checkpoint's, or 0)

    def event(self, message: str, **fields: Any) -> None:
        self.control.report(TrainerEvent(self.job.id, message, **fields))

    def run(self) -> int:
        job = self.job
        try:
            examples, valid = self._data()
        except InvalidTrainingFile as exc:
            return self._fail("invalid_training_file",
                              f"The job failed due to an invalid training file. {exc}",
                              "training_file")
        spec = self.spec
        hp = Hyperparameters.of(spec)
        torch.set_num_threads(self.config.threads)
        try:
            device = claim_device(self.config.device)
        except DeviceUnavailable as exc:
            return self._fail("device_unavailable", f"The job could not start: {exc}")
        total = hp.n_epochs * math.ceil(len(examples) / hp.batch_size)  # steps
        model = remote_model(self.config.base, self.config.executor,
                             client_name=f"trainer-{job.id}", device=str(device), background=True,
                             privacy=self.config.privacy and PrivacyConfig(backward=True))
        torch.manual_seed(job.seed)
        if spec.peft.init_adapter:  # continue from a fine-tuned model or a checkpoint
            model = PeftModel.from_pretrained(model, spec.peft.init_adapter, is_trainable=True,
                                              torch_device=str(device))
        else:
            try:
                model = get_peft_model(model, peft_config(spec.peft, total))
            except (ValueError, BaseWeightUnavailable) as exc:  # peft's refusal, or ours
                return self._fail("invalid_peft_settings", f"The job's peft settings cannot "
                                  f"be applied to {job.model}: {exc}", "peft")
        checkpoint.name_base(model, job.model)
        keep_for_backward(model, spec.peft.gradient_checkpointing)
        try:
            self._prepare(model, examples, valid, hp)
        except JobStopped as ended:
            model.get_base_model().symbiosis_executor.close()
            return ended.code
        optimizer, scheduler = optimizer_for(model, hp, total)
        root = checkpoint.checkpoint_root(self.data_dir, job.id)
        found = checkpoint.latest(root)
        progress = (checkpoint.restore(found, model, optimizer, scheduler) if found
                    else checkpoint.Progress())
        self.resumed_at = progress.step
        self.control.report(TrainerStarted(job.id, progress.step if found else 0,
                                           f"{len(examples)} examples, {hp.n_epochs} epoch(s), "
                                           f"{total} steps"
                                           + (RECOMPUTED if spec.peft.gradient_checkpointing
                                              else "")))
        for path, told in checkpoint.told(root):  # a crash may have lost a report: again
            self.control.report(TrainerCheckpoint(job.id, path=str(path), **told))
        model.train()
        try:
            self._epochs(model, optimizer, scheduler, hp, examples, valid, progress, total)
            return self._finish(model, progress, valid, hp)
        except JobStopped as ended:
            return ended.code
        finally:
            model.get_base_model().symbiosis_executor.close()

    def _data(self) -> tuple[Items, Items]:
        max_len, job = self.spec.peft.max_seq_length, self.job
        examples = load_examples(existing(job.training_path, job.training_file),
                                 self.tokenizer, max_len)
        valid: Items = []
        if job.validation_file:
            valid = load_examples(existing(job.validation_path, job.validation_file),
                                  self.tokenizer, max_len)
        return examples, valid

    def _epochs(self, model, optimizer, scheduler, hp: Hyperparameters,
                examples: Items, valid: Items, progress, total: int) -> None:
        pad, on_gradients = self._pad, None
        if self.spec.peft.method == "adalora":  # AdaLoRA reallocates ranks as it trains
            def on_gradients() -> None:
                model.base_model.update_and_allocate(progress.step)
        root = checkpoint.checkpoint_root(self.data_dir, self.job.id)
        for epoch in range(progress.epoch, hp.n_epochs):
            order = batches(len(examples), hp.batch_size, self.job.seed, epoch)
            for position in range(progress.position, len(order)):
                self._check_control(model, optimizer, scheduler, progress, epoch, position)
                step = [examples[i] for i in order[position]]
                self._use_threads(step, hp)
                result = self.objective.step(model, step, pad, optimizer, scheduler, hp,
                                             on_gradients)
                progress.step += 1
                progress.trained_tokens += result.tokens
                progress.history.append({"step": progress.step, "train_loss": result.loss,
                                         "train_accuracy": result.accuracy})
                self.event(f"Step {progress.step}/{total}: training "
                           f"loss={result.loss:.4f}", kind="metrics",
                           data={"step": progress.step, "train_loss": result.loss,
                                      "train_mean_token_accuracy": result.accuracy,
                                      "epoch": epoch + 1,
                                      "trained_tokens": progress.trained_tokens})
                every = self.spec.peft.checkpoint_every_steps
                if every and progress.step % every == 0 and position + 1 < len(order):
                    progress.epoch, progress.position = epoch, position + 1  # resume point
                    self._checkpoint(root, model, optimizer, scheduler, progress, epoch + 1, {
                        "step": progress.step, "train_loss": result.loss,
                        "train_mean_token_accuracy": result.accuracy})
            progress.epoch, progress.position = epoch + 1, 0
            last = progress.history[-1]
            metrics = {"step": last["step"], "train_loss": last["train_loss"],
                       "train_mean_token_accuracy": last["train_accuracy"]}
            if valid:
                model.eval()
                metrics["valid_loss"], metrics["valid_mean_token_accuracy"] = \
                    self.objective.evaluate(model, valid, pad, hp.micro_batch_tokens)
                model.train()
                progress.history[-1].update(valid_loss=metrics["valid_loss"],
                                            valid_mean_token_accuracy=metrics[
                                                "valid_mean_token_accuracy"])
                self.event(f"Epoch {epoch + 1}/{hp.n_epochs}: validation "
                           f"loss={metrics['valid_loss']:.4f}", kind="metrics",
                           data={"step": progress.step, **metrics,
                                 "trained_tokens": progress.trained_tokens})
            self._checkpoint(root, model, optimizer, scheduler, progress, epoch + 1, metrics)

    def _prepare(self, model, examples: Items, valid: Items, hp: Hyperparameters) -> None:
        """A DPO job's reference: each pair's log-probabilities under the model it starts from
        (before its checkpoint, if any, is restored), told as events; a pause, cancel,
        preemption or the service stopping ends the run between its micro-batches."""
        if self.objective.prepare is None:
            return
        pairs, started = len(examples) + len(valid), time.monotonic()
        self.event(f"Computing the reference log-probabilities of {pairs} pairs (the model "
                   "the job starts from)")
        for items in (examples, valid):
            self.objective.prepare(model, items, self._pad, hp.micro_batch_tokens,
                                   self._check_start)
        self.event(f"Reference log-probabilities computed in "
                   f"{time.monotonic() - started:.1f} s")

    def _check_start(self) -> None:
        """Before this run's first step: a stop keeps the job's latest checkpoint (if any)."""
        action = self.control.requested()
        if action is not None:
            raise JobStopped(self._last(stopped(self.job.id, action, None)))
        if self.control.stopping:
            self.event(service_stopping(None, "its latest checkpoint"), level="warn")
            raise JobStopped(RETRY)

    def _check_control(self, model, optimizer, scheduler, progress, epoch: int,
                       position: int) -> None:
        action = self.control.requested()
        if action is None and not self.control.stopping:
            return
        progress.epoch, progress.position = epoch, position
        if action is None and progress.step == self.resumed_at:  # nothing new to save
            self.event(service_stopping(None, f"step {progress.step}"), level="warn")
            raise JobStopped(RETRY)
        self._save(model, optimizer, scheduler, progress)
        if action is None:  # the service is stopping: the job resumes when it is back
            self.event(service_stopping(progress.step), level="warn")
            raise JobStopped(RETRY)
        raise JobStopped(self._last(stopped(self.job.id, action, progress.step)))

    @property
    def _pad(self) -> int:
        tokenizer = self.tokenizer
        return tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
            else tokenizer.eos_token_id

    def _use_threads(self, step: Items, hp: Hyperparameters) -> None:
        """Its share of the cores (told as jobs start and end), as many as the step keeps busy."""
        tokens = min(sum(e.size for e in step), hp.micro_batch_tokens)
        use_threads(step_threads(self.control.threads or self.config.threads, tokens))

    def _save(self, model, optimizer, scheduler, progress) -> None:
        """A stop's checkpoint, unless this step's is on disk: the same state, perhaps listed."""
        root = checkpoint.checkpoint_root(self.data_dir, self.job.id)
        if not checkpoint.saved_at(root, progress.step):
            checkpoint.save(root, model, optimizer, scheduler, progress)

    def _checkpoint(self, root: Path, model, optimizer, scheduler, progress, epoch: int,
                    metrics: dict) -> None:
        """One the job lists: saved with its report, then reported."""
        told = {"step": progress.step, "epoch": epoch, "metrics": metrics}
        path = checkpoint.save(root, model, optimizer, scheduler, progress, told)
        self.control.report(TrainerCheckpoint(self.job.id, path=str(path), **told))

    def _finish(self, model, progress, valid: Items, hp: Hyperparameters) -> int:
        verdict = gates.check(model, self.tokenizer, progress.history, valid, self._pad,
                              hp.micro_batch_tokens, self.spec.peft.gates, self.objective.base,
                              self.objective.reference)
        for item in verdict["checks"]:
            self.event(f"Quality gate {item['name']}: "
                       f"{'passed' if item['passed'] else 'FAILED'} ({item['detail']})",
                       level="info" if item["passed"] else "warn")
        result = checkpoint.checkpoint_root(self.data_dir, self.job.id).parent / "result"
        shutil.rmtree(result, ignore_errors=True)
        checkpoint.save_adapter(model, result)
        try:
            return self._last(TrainerFinished(self.job.id, str(result), verdict,
                                              lineage(self.job, verdict), progress.trained_tokens,
                                              checkpoint.results_csv(progress.history)))
        finally:
            shutil.rmtree(result, ignore_errors=True)  # the manager registered a copy

    def _fail(self, code: str, message: str, param: str | None = None) -> int:
        return self._last(TrainerStopped(self.job.id, JobStatus.FAILED, message, code, param))

    def _last(self, report: TrainerStopped | TrainerFinished) -> int:
        """The exit status once the last report is sent: 0 when the manager recorded it, else
        RETRY (the job is still running there, and runs again from its latest checkpoint)."""
        return 0 if self.control.last(report) else RETRY


def run(config: TrainerSpec, tokenizer: Any) -> int:
    """Process entry point. Returns non-zero when the job should be retried (it stays running
    at the manager, which requeues it)."""
    run_as_trainer()
    control = ControlChannel(config.manager, config.job_id)
    control.stop_on_sigterm()
    trainer = Trainer(config, tokenizer, control)
    lock = JobLock(Path(config.data_dir), config.job_id)
    try:
        if not lock.take(lambda: trainer.event(PREVIOUS_TRAINER, level="warn"),
                         lambda: control.stopping):
            trainer.event("The service is stopping; the job resumes from its latest "
                          "checkpoint", level="warn")
            return RETRY
        return trainer.run()
    except ExecutorUnavailable:
        log.exception("job %s lost the executor", config.job_id)
        trainer.event("The executor is unavailable; the job will resume from its latest "
                      "checkpoint", level="warn")
        return RETRY
    except Exception as exc:
        log.exception("job %s failed", config.job_id)
        return trainer._fail("internal_error", f"The job failed: {type(exc).__name__}: {exc}")
    finally:
        lock.release()
        control.close()
