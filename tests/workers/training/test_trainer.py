"""The trainer equals a plain transformers + peft loop (same examples, order, seed, schedule);
it reports to a manager (the manager's own ledger behind a stand-in socket) and never opens the
database."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, TaskType, get_peft_model, get_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, get_linear_schedule_with_warmup

from catalogue.resolve import resolve_model
from gateway.job_spec import JobSpec, PeftSpec, resolve
from openapi.fine_tuning import Hyperparameters
from state.db import Database
from state.jobs import new_id
from state.training_file import parse
from tests.helpers import calls_by_kind
from tests.workers.training.manager_stand_in import ManagerStandIn
from wire.jobs import NewJob
from workers.manager.adapter_store import AdapterRegistry
from workers.manager.job_store import JobStore
from workers.training.checkpoint import checkpoint_root
from workers.training.data import IGNORE, chat_example
from workers.training.runner import run

MODEL = "tiny-llama"
DATA = Path(__file__).parents[2] / "data"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(MODEL))


def gsm8k(n: int) -> list[dict]:
    lines = (DATA / "gsm8k_train_prompt_completion_1000.jsonl").read_text().splitlines()[:n]
    return [json.loads(line) for line in lines]


@pytest.fixture()
def manager(tmp_path, ipc_dir):
    stand_in = ManagerStandIn(tmp_path, ipc_dir)
    yield stand_in
    stand_in.close()


def make_job(manager: ManagerStandIn, rows: list[dict], validation: list[dict] | None = None,
             beta: float | None = None, **method) -> tuple[JobStore, str]:
    """A running job of these rows (`beta`: a DPO job's)."""
    files = manager.files

    def upload(name: str, rows: list[dict]) -> str:
        return files.create("acme", name, "fine-tune", "\n".join(json.dumps(r) for r in rows)
                            .encode(), examples=len(rows)).id

    jobs = manager.jobs
    settings = {"method": "lora", "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": None,
                "max_seq_length": 128, "learning_rate": 5e-3, "warmup_ratio": 0.1,
                "weight_decay": 0.0, **method}
    spec = resolve(Hyperparameters(n_epochs=3, batch_size=2),
                   settings, len(rows), 0, beta)
    valid = upload("valid.jsonl", validation) if validation else None
    job = jobs.create(new_id("ftjob"), NewJob(tenant="acme", model=MODEL,
                                              training_file=upload("train.jsonl", rows),
                                              validation_file=valid, suffix="eq", seed=1234,
                                              spec=spec))
    assert jobs.move(job.id, "queued") and jobs.move(job.id, "running")
    return jobs, job.id


def reference_adapter(rows: list[dict], tokenizer, seed: int, epochs: int, batch_size: int,
                      lr: float, max_len: int, start: Path | None = None,
                      losses: list[float] | None = None) -> dict[str, torch.Tensor]:
    """Written independently of the trainer: Trainer-style loop, transformers' own loss; from a
    fresh LoRA, or from the adapter in `start`. Each step's loss goes to `losses`."""
    examples = []
    for row in rows:
        prompt = tokenizer.encode(row["prompt"])
        completion = [*tokenizer.encode(row["completion"]), tokenizer.eos_token_id]
        ids = (prompt + completion)[:max_len]
        labels = ([IGNORE] * len(prompt) + completion)[:max_len]
        examples.append((ids, labels))
    model = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL))
    torch.manual_seed(seed)
    if start is not None:
        model = PeftModel.from_pretrained(model, start, is_trainable=True)
    else:
        model = get_peft_model(model, LoraConfig(task_type=TaskType.CAUSAL_LM, r=4,
                                                 lora_alpha=8, lora_dropout=0.0,
                                                 target_modules="all-linear"))
    total = epochs * math.ceil(len(examples) / batch_size)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                                  weight_decay=0.0)
    schedule = get_linear_schedule_with_warmup(optimizer, round(0.1 * total), total)
    model.train()
    for epoch in range(epochs):
        order = torch.randperm(len(examples),
                               generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        for start in range(0, len(examples), batch_size):
            chosen = [examples[i] for i in order[start:start + batch_size].tolist()]
            width = max(len(ids) for ids, _ in chosen)
            ids = torch.tensor([i + [0] * (width - len(i)) for i, _ in chosen])
            labels = torch.tensor([lab + [IGNORE] * (width - len(lab)) for _, lab in chosen])
            mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in chosen])
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            if losses is not None:
                losses.append(loss.item())
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                           1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
    return get_peft_model_state_dict(model)


@pytest.mark.slow
@pytest.mark.parametrize("recompute", [False, True], ids=["stored", "recomputed"])
def test_the_trained_adapter_equals_plain_peft(executor_for, tokenizer, tmp_path, manager,
                                              recompute: bool) -> None:
    """With gradient_checkpointing too: the reference never recomputes."""
    rows = gsm8k(10)
    jobs, job_id = make_job(manager, rows, gradient_checkpointing=recompute)
    assert run(manager.spec(job_id, executor_for(MODEL).endpoint), tokenizer) == 0
    job = jobs.get(job_id)
    assert job.status == "succeeded", job.error
    events, _ = jobs.events(job_id, after=None, limit=100)
    started = [e["message"] for e in events if "steps" in e["message"]]
    assert started and ("layers recomputed" in started[0]) == recompute, started
    assert job.hyperparameters == {"n_epochs": 3, "batch_size": 2,
                                   "learning_rate_multiplier": 1.0}
    record = AdapterRegistry(jobs.db, tmp_path, MODEL).get(job.fine_tuned_model)
    ours = load_file(Path(record.path) / "adapter_model.safetensors")
    saved = json.loads((Path(record.path) / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == MODEL  # as the API names it: no server path
    theirs = reference_adapter(rows, tokenizer, 1234, 3, 2, 5e-3, 128)
    assert set(ours) == set(theirs)
    worst = max((ours[k] - theirs[k]).abs().max().item() for k in ours)
    moved = max(theirs[k].abs().max().item() for k in theirs if "lora_B" in k)
    assert moved > 1e-3, "training did not move the adapter: the comparison would be empty"
    assert worst < 1e-4, worst
    checkpoints, _ = jobs.checkpoints(job_id)
    assert [c["step_number"] for c in checkpoints] == [15, 10, 5]


def test_a_job_whose_training_file_is_gone_fails_naming_it(executor_for, tokenizer,
                                                           manager) -> None:
    jobs, job_id = make_job(manager, gsm8k(10))
    spec = manager.spec(job_id, executor_for(MODEL).endpoint)
    Path(spec.job.training_path).unlink()
    assert run(spec, tokenizer) == 0
    job = jobs.get(job_id)
    assert job.status == "failed" and job.error == {
        "code": "invalid_training_file", "param": "training_file",
        "message": "The job failed due to an invalid training file. The file "
                   f"{job.training_file} no longer exists."}, job.error


def trained_adapter(jobs: JobStore, job_id: str, data_dir: Path) -> dict[str, torch.Tensor]:
    record = AdapterRegistry(jobs.db, data_dir, MODEL).get(jobs.get(job_id).fine_tuned_model)
    return load_file(Path(record.path) / "adapter_model.safetensors")


@pytest.mark.slow
def test_checkpoints_every_n_steps_and_a_resume_from_one_mid_epoch(executor_for, tokenizer,
                                                                  tmp_path, manager) -> None:
    rows = gsm8k(10)
    endpoint = executor_for(MODEL).endpoint
    jobs, first = make_job(manager, rows, checkpoint_every_steps=2)
    assert run(manager.spec(first, endpoint), tokenizer) == 0
    checkpoints, _ = jobs.checkpoints(first, limit=100)
    assert sorted(c["step_number"] for c in checkpoints) == [2, 4, 5, 6, 8, 10, 12, 14, 15]
    theirs = reference_adapter(rows, tokenizer, 1234, 3, 2, 5e-3, 128)
    ours = trained_adapter(jobs, first, tmp_path)
    assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) < 1e-4
    # the same job again, crashed after step 8 (mid-epoch 2): it resumes from that checkpoint
    _, second = make_job(manager, rows, checkpoint_every_steps=2)
    resume_at = checkpoint_root(tmp_path, second) / "step-8"
    shutil.copytree(checkpoint_root(tmp_path, first) / "step-8", resume_at)
    assert run(manager.spec(second, endpoint), tokenizer) == 0
    messages = [e["message"] for e in jobs.events(second, after=None, limit=100)[0]]
    assert any("resumed at step 8" in m for m in messages), messages
    resumed = trained_adapter(jobs, second, tmp_path)
    assert max((resumed[k] - theirs[k]).abs().max().item() for k in resumed) < 1e-4


@pytest.mark.slow
def test_a_job_continues_from_a_fine_tuned_model(executor_for, tokenizer, tmp_path,
                                                manager) -> None:
    rows = gsm8k(10)
    endpoint = executor_for(MODEL).endpoint
    jobs, first = make_job(manager, rows)
    assert run(manager.spec(first, endpoint), tokenizer) == 0
    done = AdapterRegistry(jobs.db, tmp_path, MODEL).get(jobs.get(first).fine_tuned_model)
    _, second = make_job(manager, rows, init_model=done.id, init_adapter=done.path)
    assert run(manager.spec(second, endpoint), tokenizer) == 0
    assert jobs.get(second).public()["model"] == done.id
    losses: list[float] = []
    theirs = reference_adapter(rows, tokenizer, 1234, 3, 2, 5e-3, 128, start=Path(done.path),
                               losses=losses)
    ours = trained_adapter(jobs, second, tmp_path)
    assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) < 1e-4
    events = jobs.events(second, after=None, limit=100)[0]
    first_loss = next(e["data"]["train_loss"] for e in events
                      if e["type"] == "metrics" and e["data"]["step"] == 1)
    assert abs(first_loss - losses[0]) < 1e-4  # it starts from the fine-tuned weights
    fresh = next(e["data"]["train_loss"] for e in jobs.events(first, after=None, limit=100)[0]
                 if e["type"] == "metrics" and e["data"]["step"] == 1)
    assert first_loss < fresh - 0.05


@pytest.mark.slow
def test_a_jobs_evaluation_reaches_the_executor_as_training_work(executor_for, tokenizer,
                                                                 manager) -> None:
    """Its validation passes and the gate against the base run without grad: still training
    calls (`ExecutorClient.background`), queued behind tenants' inference, not beside it."""
    endpoint = executor_for(MODEL).endpoint
    rows = gsm8k(6)
    jobs, job_id = make_job(manager, rows[:4], validation=rows[4:])
    before = calls_by_kind(endpoint)
    assert run(manager.spec(job_id, endpoint), tokenizer) == 0
    inference, training = (a - b for a, b in zip(calls_by_kind(endpoint), before, strict=True))
    assert jobs.get(job_id).status == "succeeded", jobs.get(job_id).error
    messages = [e["message"] for e in jobs.events(job_id, after=None, limit=100)[0]]
    assert sum("validation loss=" in m for m in messages) == 3, messages  # one an epoch
    assert any("validation_vs_base" in m for m in messages), messages
    assert inference == 0 and training > 0, (inference, training)


def test_chat_labels_cover_exactly_the_assistant_messages(tokenizer) -> None:
    messages = [{"role": "system", "content": "Be terse."},
                {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Bye"},
                {"role": "assistant", "content": "Ignored.", "weight": 0},
                {"role": "user", "content": "Really?"}, {"role": "assistant", "content": "Yes."}]
    ids, labels = chat_example(parse(json.dumps({"messages": messages})).turns, tokenizer)
    built_in = tokenizer.apply_chat_template(
        [{k: v for k, v in m.items() if k != "weight"} for m in messages],
        return_assistant_tokens_mask=True, return_dict=True)
    assert ids == built_in["input_ids"]
    learned = tokenizer.decode([i for i, label in zip(ids, labels, strict=True)
                                if label != IGNORE])
    assert learned == "Hello.<|im_end|>\nYes.<|im_end|>\n"
    mask = built_in["assistant_masks"]  # the template's own {% generation %} markers
    ours = [label != IGNORE for label in labels]
    weighted_out = [i for i, m in enumerate(mask) if m and not ours[i]]
    assert tokenizer.decode([ids[i] for i in weighted_out]).startswith("Ignored.")


def test_gradient_accumulation_equals_one_big_batch(tokenizer) -> None:
    from executor.local import LocalExecutor
    from tests.peft_reference import build_pair
    from workers.training.data import Example, prompt_completion_example
    from workers.training.loop import Hyperparameters, micro_batches, optimizer_for, train_step

    examples = [Example(*prompt_completion_example(r["prompt"], r["completion"], tokenizer))
                for r in gsm8k(4)]
    results = []
    for micro in (100_000, 150):  # one piece, then micro-batches of ~150 padded tokens
        _, model = build_pair(MODEL, "lora", LocalExecutor.load(MODEL))
        model.train()
        hp = Hyperparameters(1, 4, 1e-2, warmup_ratio=0.0, micro_batch_tokens=micro)
        optimizer, schedule = optimizer_for(model, hp, 1)
        loss = train_step(model, examples, tokenizer.eos_token_id, optimizer, schedule, hp).loss
        results.append((loss, {n: p.detach().clone() for n, p in model.named_parameters()
                               if p.requires_grad}))
    assert len(micro_batches(examples, 150)) > 1
    (loss_a, params_a), (loss_b, params_b) = results
    assert loss_a == pytest.approx(loss_b, abs=1e-5)
    assert max((params_a[k] - params_b[k]).abs().max().item() for k in params_a) < 1e-5


def test_queued_jobs_are_claimed_fairly_across_tenants(tmp_path) -> None:
    db = Database(tmp_path / "state.db")
    jobs = JobStore(db)
    created = []
    for tenant in ("flood", "flood", "flood", "quiet", "flood"):
        job = jobs.create(new_id("ftjob"), NewJob(tenant=tenant, model=MODEL,
                                                  training_file="file-x", seed=1,
                                                  spec=JobSpec(1, 1, 1.0, PeftSpec())))
        jobs.move(job.id, "queued")
        created.append(job)
    first = jobs.claim(2)
    assert [j.tenant for j in first] == ["flood", "quiet"]  # quiet is not stuck behind flood
    assert jobs.claim(2) == []  # two are running: at capacity
    jobs.move(first[0].id, "succeeded")
    assert [j.id for j in jobs.claim(2)] == [created[1].id]  # then the oldest waiting
