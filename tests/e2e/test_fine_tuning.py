"""Fine-tuning through the OpenAI Files and fine_tuning APIs, with real processes and the SDK."""

from __future__ import annotations

import csv
import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch

from tests.e2e.adapters import MODEL, Reference
from tests.e2e.conftest import OPERATOR, Deployment, _record_path
from tests.e2e.jobs import (
    ANSWER,
    TOPICS,
    ask,
    create,
    memorization_file,
    start_stack,
    steps_done,
    wait,
    wait_steps,
)

pytestmark = pytest.mark.slow
DATA = Path(__file__).parents[1] / "data"
@pytest.fixture(scope="module")
def ft(tmp_path_factory) -> Iterator[Deployment]:
    stack = start_stack(tmp_path_factory.mktemp("ft") / "data")
    yield Deployment(stack, {})
    stack.stop()


def test_memorization_job_end_to_end(ft: Deployment) -> None:
    client = ft.client("acme")
    upload = client.files.create(file=("memo.jsonl", memorization_file()), purpose="fine-tune",
                                 expires_after={"anchor": "created_at", "seconds": 3600})
    assert upload.purpose == "fine-tune" and upload.filename == "memo.jsonl"
    assert upload.expires_at == upload.created_at + 3600
    assert client.files.content(upload.id).content == memorization_file()
    job = wait(client, create(client, upload.id), ("succeeded",))
    assert job.fine_tuned_model == f"ft:{MODEL}:acme:memo:{job.id}"
    assert job.trained_tokens > 0 and job.finished_at >= job.created_at
    assert job.hyperparameters.n_epochs == 10 and job.hyperparameters.batch_size == 2
    assert ask(client, job.fine_tuned_model) == ANSWER  # servable at once, no restart
    assert ask(client, job.fine_tuned_model, "tigers") == ANSWER
    assert ask(client, MODEL) != ANSWER
    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    metrics = [e for e in events if e.type == "metrics"]
    assert len(metrics) == 50 and metrics[0].message.startswith("Step 50/50: training loss=")
    assert events[0].message == "The job has successfully completed"
    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.step_number for c in checkpoints] == list(range(50, 0, -5))
    assert ask(client, checkpoints[0].fine_tuned_model_checkpoint) == ANSWER
    rows = list(csv.DictReader(io.StringIO(client.files.content(job.result_files[0]).text)))
    assert len(rows) == 50 and float(rows[-1]["train_loss"]) < float(rows[0]["train_loss"])
    assert job.fine_tuned_model in [m.id for m in client.models.list().data]
    listed = client.fine_tuning.jobs.list(limit=5)
    assert job.id in [j.id for j in listed.data]


def test_bad_files_are_rejected_with_line_numbers(ft: Deployment) -> None:
    client = ft.client("acme")
    toy = (DATA / "openai_cookbook_toy_chat_fine_tuning.jsonl").read_bytes()
    with pytest.raises(openai.BadRequestError) as info:
        client.files.create(file=("toy.jsonl", toy), purpose="fine-tune")
    message = info.value.body["message"]
    for expected in ("line 3: no system message", "line 4: example has no user message",
                     "line 5: example is"):
        assert expected in message, message
    for junk in (b"\x00\x01binary", b"not json at all\n", b'{"prompt": "only half"}'):
        with pytest.raises(openai.BadRequestError) as info:
            client.files.create(file=("junk.jsonl", junk), purpose="fine-tune")
        assert "line 1" in info.value.body["message"] or "UTF-8" in info.value.body["message"]
    few = client.files.create(file=("few.jsonl", memorization_file(5)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model=MODEL, training_file=few.id)
    assert job.status == "failed" and job.error.code == "invalid_n_examples"
    assert "5 example(s)" in job.error.message
    with pytest.raises(openai.NotFoundError):
        ft.client("beta").fine_tuning.jobs.create(model=MODEL, training_file=few.id)
    with pytest.raises(openai.NotFoundError):
        ft.client("beta").files.retrieve(few.id)
    with pytest.raises(openai.NotFoundError):
        ft.client("beta").fine_tuning.jobs.retrieve(job.id)


def test_adapters_on_the_head_and_the_embeddings_train_and_serve_as_peft_does(
        ft: Deployment) -> None:
    """The head and the embeddings are base weights in the executor: peft, saving an adapter on
    them, also copied those (a failed job); now the adapter alone is kept, and it serves as
    plain peft does with it. A module the model lacks is refused before a job is made."""
    client = ft.client("acme")
    upload = client.files.create(file=("memo.jsonl", memorization_file()), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError) as typo:
        create(client, upload.id, epochs=1, target_modules=["q_prj"])
    assert typo.value.body["param"] == "peft.target_modules"
    norm = wait(client, create(client, upload.id, epochs=1, target_modules=["input_layernorm"]),
                ("succeeded", "failed"))  # a module peft cannot adapt: known once it tries
    assert norm.status == "failed" and norm.error.code == "invalid_peft_settings"
    assert norm.error.param == "peft" and "Target module LlamaRMSNorm" in norm.error.message
    for targets in (["q_proj", "lm_head"], ["embed_tokens"]):
        job = wait(client, create(client, upload.id, epochs=1, target_modules=targets),
                   ("succeeded", "failed"))
        assert job.status == "succeeded", job.error
        reference = Reference(Path(_record_path(ft.stack.data_dir, job.fine_tuned_model)))
        prompt = "Tell me something about rivers."
        ids = reference.ids(prompt)
        want = reference.logprobs(ids)[-1]
        assert not torch.allclose(want, Reference(None).logprobs(ids)[-1])  # it learned
        got = client.completions.create(model=job.fine_tuned_model, prompt=prompt, max_tokens=1,
                                        temperature=0, logprobs=5).choices[0].logprobs
        for token, logprob in got.top_logprobs[0].items():
            assert logprob == pytest.approx(want[reference.tokenizer.convert_tokens_to_ids(
                reference.tokenizer.tokenize(token))[0]].item(), abs=1e-4), (targets, token)


def test_pause_resume_and_cancel(ft: Deployment) -> None:
    client = ft.client("acme")
    upload = client.files.create(file=("memo.jsonl", memorization_file()), purpose="fine-tune")
    job_id = create(client, upload.id, epochs=40, suffix="pause")
    wait_steps(client, job_id, 3)
    paused = client.fine_tuning.jobs.pause(job_id)
    assert paused.status == "paused"
    at_pause = steps_done(client, job_id)
    time.sleep(1)
    assert steps_done(client, job_id) == at_pause  # nothing trains while paused
    with pytest.raises(openai.ConflictError) as in_use:  # the job still needs its file
        client.files.delete(upload.id)
    assert job_id in in_use.value.body["message"]
    # the manager answers once it queued the job, and a free slot starts it at once
    assert client.fine_tuning.jobs.resume(job_id).status in ("queued", "running")
    wait(client, job_id, ("running",))
    while steps_done(client, job_id) <= at_pause + 2:
        time.sleep(0.2)
    resumed = [e.message for e in client.fine_tuning.jobs.list_events(job_id, limit=100).data]
    assert any(f"resumed at step {at_pause}" in m for m in resumed)
    cancelled = client.fine_tuning.jobs.cancel(job_id)
    assert cancelled.status == "cancelled" and cancelled.fine_tuned_model is None
    with pytest.raises(openai.BadRequestError):
        client.fine_tuning.jobs.resume(job_id)
    assert client.files.delete(upload.id).deleted  # a finished job lets go of it
    steps = [e.data["step"] for e in client.fine_tuning.jobs.list_events(job_id, limit=200).data
             if e.type == "metrics"]
    assert len(steps) == len(set(steps))  # no step's event twice across pause and resume


def long_examples_file() -> bytes:
    """Examples of ~200 tokens, so that a step is long next to an HTTP round trip."""
    text = " ".join(f"{t} are remembered here" for t in TOPICS * 8)
    rows = [{"messages": [{"role": "user", "content": f"Recite the list {i}."},
                          {"role": "assistant", "content": text}]} for i in range(10)]
    return "\n".join(json.dumps(r) for r in rows).encode()


def after_a_step(client: openai.OpenAI, job_id: str, at_least: int) -> int:
    """Watch the events until a step finishes (then the next has just begun): its number."""
    seen = steps_done(client, job_id)
    while True:
        now = steps_done(client, job_id)
        if now > seen and now >= at_least:
            return now
        seen = now
        time.sleep(0.01)


def test_pause_and_cancel_take_effect_within_one_step(ft: Deployment) -> None:
    """A running job stops after the step it is in: the pause and cancel travel as messages to
    its trainer (no database polling), and the gateway answers once the trainer stopped."""
    client = ft.client("acme")
    upload = client.files.create(file=("long.jsonl", long_examples_file()), purpose="fine-tune")
    job_id = create(client, upload.id, epochs=30, suffix="stop")
    wait(client, job_id, ("running",))
    done = after_a_step(client, job_id, 2)
    started = time.monotonic()
    paused = client.fine_tuning.jobs.pause(job_id)
    pause_s = time.monotonic() - started
    assert paused.status == "paused"  # in effect when the call returns
    events = [e.message for e in client.fine_tuning.jobs.list_events(job_id, limit=20).data]
    stopped_at = next(int(m.split("step ")[1].split(";")[0]) for m in events
                      if m.startswith("Job paused at step"))
    assert stopped_at <= done + 1, (done, stopped_at)  # the step under way, no more
    assert steps_done(client, job_id) == stopped_at
    client.fine_tuning.jobs.resume(job_id)
    wait(client, job_id, ("running",))
    done = after_a_step(client, job_id, stopped_at + 1)
    cancelled = client.fine_tuning.jobs.cancel(job_id)
    assert cancelled.status == "cancelled"
    assert steps_done(client, job_id) <= done + 1
    assert pause_s < 20, pause_s


def test_three_jobs_and_a_streaming_tenant_share_one_executor(tmp_path) -> None:
    # without the idle twin (as on a GPU): the jobs' calls share the tenants' batches
    stack = start_stack(tmp_path / "data", env={"SYMBIOSIS_IDLE_TRAINING": "false"})
    try:
        share_one_executor(Deployment(stack, {}))
    finally:
        stack.stop()


def share_one_executor(ft: Deployment) -> None:
    acme, beta, gamma = ft.client("acme"), ft.client("beta"), ft.client("gamma")
    files = {c: c.files.create(file=("m.jsonl", memorization_file()), purpose="fine-tune").id
             for c in (acme, beta)}
    jobs = [(acme, create(acme, files[acme], method="lora", suffix="c1", epochs=6,
                          target_modules=["q_proj", "v_proj", "lm_head"])),
            (acme, create(acme, files[acme], method="ia3", suffix="c2", epochs=6)),
            (beta, create(beta, files[beta], method="prefix_tuning", suffix="c3", epochs=6))]
    stop = threading.Event()
    streamed: list[int] = []

    def stream() -> None:
        while not stop.is_set():
            # one token a request: a decode step runs as stretches, which training calls never
            # share; what meets the jobs' calls is each request's own head call after its
            # prompt (max_tokens=8: 2-3 mixed batches a run, none in 2 runs of 10; 1: 9 a run),
            # and the head is called in training only by a job whose adapter wraps it (c1's
            # LoRA on lm_head): the others' head and loss are one call of its own
            # (`workers.remote.loss`)
            chunks = list(gamma.chat.completions.create(
                model=MODEL, stream=True, max_tokens=1,
                messages=[{"role": "user", "content": "Keep talking."}]))
            streamed.append(len(chunks))

    streamer = threading.Thread(target=stream)
    streamer.start()
    try:
        together = 0
        while together < 2:
            statuses = [c.fine_tuning.jobs.retrieve(j).status for c, j in jobs]
            together = max(together, statuses.count("running"))
            assert "failed" not in statuses
            time.sleep(0.3)
        finished = [wait(c, j, ("succeeded",)) for c, j in jobs]
    finally:
        stop.set()
        streamer.join(60)
    assert all(job.fine_tuned_model for job in finished)
    assert len(streamed) >= 2
    metrics = httpx.get(f"{ft.stack.base_url}/metrics", headers=OPERATOR).text
    mixed = next(float(line.split()[-1]) for line in metrics.splitlines()
                 if line.startswith("symbiosis_executor_mixed_batches_total"))
    assert mixed > 0, "no batch mixed training and inference calls"


def test_real_data_gsm8k_loss_falls(ft: Deployment) -> None:
    client = ft.client("beta")
    lines = (DATA / "gsm8k_train_chat_1000.jsonl").read_text().splitlines()
    upload = client.files.create(file=("gsm8k.jsonl", "\n".join(lines[:40]).encode()),
                                 purpose="fine-tune")
    valid = client.files.create(file=("valid.jsonl", "\n".join(lines[900:910]).encode()),
                                purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model=MODEL, training_file=upload.id, validation_file=valid.id, seed=3,
        hyperparameters={"n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 20},
        extra_body={"peft": {"method": "lora", "r": 8, "max_seq_length": 256}})
    job = wait(client, job.id, ("succeeded",))
    rows = list(csv.DictReader(io.StringIO(client.files.content(job.result_files[0]).text)))
    losses = [float(r["train_loss"]) for r in rows]
    assert len(losses) == 20
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.05, losses
    valid_losses = [float(r["valid_loss"]) for r in rows if r["valid_loss"]]
    assert len(valid_losses) == 2 and valid_losses[1] < valid_losses[0]
    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.step_number for c in checkpoints] == [20, 10]
    assert all(c.metrics.valid_loss is not None and c.metrics.train_loss is not None
               for c in checkpoints)
