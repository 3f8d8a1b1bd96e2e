"""Quality gates on a real stack: a diverging job's model stays a candidate out of service until
promoted; a good one (validation no worse than the base, a held-out prompt answered) serves; with
`register_as`, each result is a version of one name (lineage included), served only if it passed."""

from __future__ import annotations

import hashlib

import openai
import pytest

from tests.e2e.adapters import MODEL
from tests.e2e.conftest import Deployment
from tests.e2e.jobs import ANSWER, memorization_file, start_stack, wait

pytestmark = pytest.mark.slow


def job(client: openai.OpenAI, training: str, validation: str | None, suffix: str,
        **extra) -> str:
    return client.fine_tuning.jobs.create(
        model=MODEL, training_file=training, validation_file=validation, suffix=suffix, seed=7,
        method={"type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": extra.pop("epochs", 3), "batch_size": 2,
            "learning_rate_multiplier": 50}}},
        extra_body=extra).id


def test_a_diverging_job_stays_out_of_service_and_a_good_one_serves(tmp_path) -> None:
    stack = start_stack(tmp_path / "data")
    try:
        client = Deployment(stack, {}).client("acme")
        training = client.files.create(file=("t.jsonl", memorization_file()),
                                       purpose="fine-tune").id
        validation = client.files.create(file=("v.jsonl", memorization_file(4)),
                                         purpose="fine-tune").id
        # an absurd learning rate: the weights blow up and the model ends up predicting every
        # token alike (loss ln 50259 = 10.82, barely below the random start): no real drop
        bad = wait(client, job(client, training, None, "bad", epochs=1,
                               peft={"method": "lora", "learning_rate": 1e6},
                               gates={"min_loss_drop": 0.05}, register_as="memo"),
                   ("succeeded",))
        assert bad.gates["passed"] is False, bad.gates
        failed = {c["name"] for c in bad.gates["checks"] if not c["passed"]}
        assert failed & {"finite_losses", "training_loss_fell"}, bad.gates
        listed = {m.id: m for m in client.models.list().data}
        assert listed[bad.fine_tuned_model].in_service is False
        with pytest.raises(openai.APIStatusError) as info:
            client.completions.create(model=bad.fine_tuned_model, prompt="Hi", max_tokens=2)
        assert info.value.status_code == 409 and info.value.body["code"] == "model_not_in_service"
        promoted = client.post(f"/fine_tuning/models/{bad.fine_tuned_model}/promote",
                               cast_to=object)
        assert promoted["in_service"] is True
        assert client.completions.create(model=bad.fine_tuned_model, prompt="Hi",
                                         max_tokens=2).choices

        prompt = ("<|im_start|>user\nTell me something about apples.<|im_end|>\n"
                  "<|im_start|>assistant\n")
        with pytest.raises(openai.APIStatusError) as info:  # its only version is a candidate
            client.completions.create(model="acme/memo", prompt="Hi", max_tokens=2)
        assert info.value.status_code == 409
        good = wait(client, job(client, training, validation, "good", epochs=8, gates={
            "min_loss_drop": 0.05, "held_out": [{"prompt": prompt, "completion": ANSWER}]},
            register_as="memo"), ("succeeded",))
        assert good.gates["passed"] is True, [c for c in good.gates["checks"]
                                              if not c["passed"]]
        names = {c["name"] for c in good.gates["checks"]}
        assert {"finite_losses", "training_loss_fell", "validation_vs_base",
                "held_out_1"} <= names
        listed = {m.id: m for m in client.models.list().data}
        assert listed[good.fine_tuned_model].in_service is True
        answer = client.chat.completions.create(
            model=good.fine_tuned_model, temperature=0, max_tokens=12,
            messages=[{"role": "user", "content": "Tell me something about apples."}])
        assert answer.choices[0].message.content == ANSWER

        versions = client.get("/adapters/acme/memo/versions", cast_to=object)
        assert versions["serving"] == [{"version": 2, "weight": 100}]
        candidate, promoted = versions["data"]
        assert (candidate["job_id"], candidate["passed_gates"]) == (bad.id, False)
        assert (promoted["job_id"], promoted["passed_gates"]) == (good.id, True)
        lineage = promoted["lineage"]
        assert lineage["training_file"] == training and lineage["validation_file"] == validation
        assert lineage["training_file_sha256"] == hashlib.sha256(memorization_file()).hexdigest()
        assert lineage["hyperparameters"]["n_epochs"] == 8 and lineage["gates"]["passed"]
        assert lineage["peft"]["method"] == "lora" and len(lineage["adapter_sha256"]) == 64
        named = client.chat.completions.with_raw_response.create(
            model="acme/memo", temperature=0, max_tokens=12,
            messages=[{"role": "user", "content": "Tell me something about apples."}])
        assert named.headers["x-symbiosis-model-version"] == "acme/memo@2"
        assert named.parse().choices[0].message.content == ANSWER
    finally:
        stack.stop()
