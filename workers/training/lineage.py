"""Where a fine-tuned model came from, as its registry entry keeps it: the job, its data (with
SHA-256s), its settings and its quality gates' results."""

from __future__ import annotations

from state.storage import file_sha256
from wire.jobs import TrainerJob


def lineage(job: TrainerJob, verdict: dict) -> dict:
    found = {"job_id": job.id, "gates": verdict}
    for key, path in (("training_file", job.training_path),
                      ("validation_file", job.validation_path)):
        found[key] = getattr(job, key)
        if path:
            found[f"{key}_sha256"] = file_sha256(path)
    found["hyperparameters"] = job.spec.hyperparameters()
    found["peft"] = {k: v for k, v in job.spec.peft_dict().items() if k != "init_adapter"}
    return found
