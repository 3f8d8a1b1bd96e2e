"""A DPO job (`method: {"type": "dpo"}`) on a real stack through the official SDK: it trains on a
preference file and its served model favours the preferred outputs more than the base model does,
each output's log-probability read back from the served models themselves (completions with
`echo` and `logprobs` over the trainer's own token ids); its validation loss beats the starting
model's (log 2: the base, where the job starts, is the reference) and its gates and events say
so."""

from __future__ import annotations

import json
import math

import openai
import pytest
from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from tests.e2e.adapters import MODEL
from tests.e2e.conftest import Deployment
from tests.e2e.jobs import ANSWER, TOPICS, start_stack, wait
from workers.training.data import IGNORE, Example, load_examples

pytestmark = pytest.mark.slow


def preference_file(topics: list[str]) -> bytes:
    rows = [{"input": {"messages": [{"role": "user",
                                     "content": f"Tell me something about {topic}."}]},
             "preferred_output": [{"role": "assistant", "content": ANSWER}],
             "non_preferred_output": [{"role": "assistant", "content": "I know nothing."}]}
            for topic in topics]
    return "\n".join(json.dumps(row) for row in rows).encode()


def output_logp(client: openai.OpenAI, model: str, example: Example) -> float:
    """log p(its labelled tokens | what comes before), as the served model scores them."""
    scored = client.completions.create(model=model, prompt=example.ids, echo=True, logprobs=0,
                                       max_tokens=1, temperature=0)
    logprobs = scored.choices[0].logprobs.token_logprobs[:len(example.ids)]
    return sum(logprobs[t] for t in range(1, len(example.ids)) if example.labels[t] != IGNORE)


def test_a_dpo_job_makes_its_model_favour_the_preferred_outputs(tmp_path) -> None:
    stack = start_stack(tmp_path / "data")
    try:
        client = Deployment(stack, {}).client("acme")
        files = {name: client.files.create(file=(f"{name}.jsonl", preference_file(topics)),
                                           purpose="fine-tune").id
                 for name, topics in (("train", TOPICS), ("valid", TOPICS[:4]))}
        job = wait(client, client.fine_tuning.jobs.create(
            model=MODEL, training_file=files["train"], validation_file=files["valid"],
            suffix="dpo", seed=7, method={"type": "dpo", "dpo": {"hyperparameters": {
                "n_epochs": 3, "batch_size": 2, "learning_rate_multiplier": 25,
                "beta": 0.1}}}).id, ("succeeded",))
        assert job.method.type == "dpo" and job.method.dpo.hyperparameters.beta == 0.1
        checks = {check["name"]: check for check in job.gates["checks"]}
        assert checks["validation_vs_base"]["passed"], checks
        assert f"starting model {math.log(2):.4f}" in checks["validation_vs_base"]["detail"]
        events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
        valid = [e.data["valid_loss"] for e in events if e.data and "valid_loss" in e.data]
        assert len(valid) == 3 and valid[0] < math.log(2), valid
        messages = [e.message for e in events]
        assert (f"Computing the reference log-probabilities of {len(TOPICS) + 4} pairs (the "
                "model the job starts from)") in messages
        path = tmp_path / "train.jsonl"
        path.write_bytes(preference_file(TOPICS))
        pairs = load_examples(path, AutoTokenizer.from_pretrained(resolve_model(MODEL)), 2048)
        gained = []
        for pair in pairs:
            margins = [output_logp(client, model, pair.preferred) -
                       output_logp(client, model, pair.non_preferred)
                       for model in (MODEL, job.fine_tuned_model)]
            gained.append(margins[1] - margins[0])
        assert all(gain > 0 for gain in gained), gained
    finally:
        stack.stop()
