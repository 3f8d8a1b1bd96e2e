"""DPO fine-tuning jobs (`method: {"type": "dpo"}`) through the gateway, with the manager's job
queue behind it: a preference file is read as that format line by line, a DPO job takes only
such a file (and a supervised job never does), its beta resolved ("auto": 0.1) and shown where
OpenAI shows it, and methods that cannot run here, or another method's settings beside the
type's, are refused by name."""

from __future__ import annotations

import json

from tests.gateway.conftest import KEY
from tests.gateway.test_fine_tuning_jobs import upload
from tests.gateway.test_validation import assert_openai_error


def preference(n: int) -> dict:
    return {"input": {"messages": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": f"What is {n} + {n}?"}]},
            "preferred_output": [{"role": "assistant", "content": f"{2 * n}."}],
            "non_preferred_output": [{"role": "assistant", "content": f"It is {2 * n + 1}."}]}


def upload_lines(client, lines: list[dict]):
    data = "\n".join(json.dumps(line) for line in lines).encode()
    return client.post("/v1/files", headers=KEY, data={"purpose": "fine-tune"},
                       files={"file": ("prefs.jsonl", data, "application/jsonl")})


def dpo(hyperparameters: dict | None = None) -> dict:
    return {"type": "dpo", "dpo": {"hyperparameters": hyperparameters or {}}}


def test_a_dpo_job_trains_on_a_preference_file_with_its_beta_resolved(managed) -> None:
    client, manager = managed
    uploaded = upload_lines(client, [preference(n) for n in range(10)])
    assert uploaded.status_code == 200, uploaded.text
    training = uploaded.json()["id"]
    assert manager.records.files.get(training, "acme").format == "preference"
    created = client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        "model": "tiny-llama", "training_file": training, "method": dpo({"n_epochs": 2})})
    assert created.status_code == 200, created.text
    job = created.json()
    assert job["method"] == {"type": "dpo", "dpo": {"hyperparameters": {
        "n_epochs": 2, "batch_size": 1, "learning_rate_multiplier": 1.0, "beta": 0.1}}}
    assert job["hyperparameters"] == {"n_epochs": 2, "batch_size": 1,
                                      "learning_rate_multiplier": 1.0}
    assert manager.records.jobs.get(job["id"]).spec.beta == 0.1
    chosen = client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        "model": "tiny-llama", "training_file": training, "method": dpo({"beta": 0.25})})
    assert chosen.json()["method"]["dpo"]["hyperparameters"]["beta"] == 0.25
    supervised = client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        "model": "tiny-llama", "training_file": upload(client)})
    assert supervised.json()["method"]["type"] == "supervised"
    assert manager.records.jobs.get(supervised.json()["id"]).spec.beta is None


def test_each_method_takes_only_its_format(managed) -> None:
    client, _ = managed
    pairs = upload_lines(client, [preference(n) for n in range(10)]).json()["id"]
    chat = upload(client)
    for method, training, validation, param, wanted in (
            (None, pairs, None, "training_file", "chat or prompt/completion"),
            (dpo(), chat, None, "training_file", "preference format"),
            (dpo(), pairs, chat, "validation_file", "preference format")):
        error = assert_openai_error(client.post("/v1/fine_tuning/jobs", headers=KEY, json={
            "model": "tiny-llama", "training_file": training, "validation_file": validation,
            **({"method": method} if method else {})}), 400)
        assert (error["code"], error["param"]) == ("invalid_file_format", param), error
        assert wanted in error["message"], error


def test_a_beta_out_of_bounds_a_method_not_run_here_and_anothers_settings_are_refused(
        managed) -> None:
    client, _ = managed
    job = {"model": "tiny-llama",
           "training_file": upload_lines(client, [preference(n) for n in range(10)]).json()["id"]}
    for beta in (0, -1, 3):
        error = assert_openai_error(client.post("/v1/fine_tuning/jobs", headers=KEY, json={
            **job, "method": dpo({"beta": beta})}), 400)
        assert error["param"] == "method.dpo.hyperparameters.beta", error
    error = assert_openai_error(client.post("/v1/fine_tuning/jobs", headers=KEY, json={
        **job, "method": {"type": "reinforcement"}}), 400)
    assert (error["code"], error["param"]) == ("unsupported_method", "method.type"), error
    for method, other in (({"type": "supervised", "dpo": {}}, "dpo"),
                          ({**dpo(), "supervised": {}}, "supervised")):
        error = assert_openai_error(client.post("/v1/fine_tuning/jobs", headers=KEY, json={
            **job, "method": method}), 400)
        assert error["param"] == f"method.{other}" and "but method.type is" in \
            error["message"], error


def test_a_bad_preference_line_is_named_at_upload(managed) -> None:
    client, _ = managed
    same = preference(3)
    same["non_preferred_output"] = same["preferred_output"]
    lines = [preference(1), {**preference(2), "preferred_output": "4."}, same]
    error = assert_openai_error(upload_lines(client, lines), 400)
    assert "line 2: 'preferred_output' must be a list of one assistant message" in \
        error["message"], error
    assert "line 3: the preferred and non-preferred outputs are the same" in error["message"]
