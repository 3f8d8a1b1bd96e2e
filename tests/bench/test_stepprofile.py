"""bench.stepprofile: one fine-tuning step's time split, each side in its own process."""

from __future__ import annotations

import json
import re

import torch
from transformers import AutoModelForCausalLM

from bench.stepprofile import main
from catalogue.resolve import resolve_model
from workers.threads import step_threads
from workers.training.priority import TRAINER_NICE


def test_a_step_is_split_into_executor_calls_and_the_clients_own_work(tmp_path) -> None:
    out, executor_table = tmp_path / "step.json", tmp_path / "executor.txt"
    assert main(["--model", "tiny-llama", "--length", "16", "--warmup", "1", "--steps", "1",
                 "--out", str(out), "--executor-profile", str(executor_table)]) == 0
    result = json.loads(out.read_text())
    # the measured step's calls only, not the warm-up's too: tiny-llama's step makes 7 through
    # kept stretches (the embedding, the first q/k/v, a stretch a layer, the head's loss; the
    # backward a stretch a layer), 14 the warm-up and the step
    assert result["calls"] == 7
    assert 0 < result["executor_ms"] <= result["calls_ms"] < result["ours_ms"]
    assert result["client_ms"] > 0 and result["plain_ms"] > 0
    assert "_StretchFn" in result["profile"]
    # ours as a lone trainer: on its threads for 2 x 16 tokens (one), at its priority; plain
    # at torch's default threads and the process's priority
    assert result["threads"] == step_threads(result["plain_threads"], 2 * 16) == 1
    assert result["nice"] >= max(TRAINER_NICE, result["plain_nice"])
    # the executor's own profile, its server thread included: loading runs one traced forward
    # in the main thread (each linear layer once); the calls' matmuls run in the server's
    table = executor_table.read_text()
    assert table.startswith("== by self host time")
    linears = sum(isinstance(m, torch.nn.Linear) for m in
                  AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama")).modules())
    # every product is an aten::mm (or addmm, with a bias): through `linear` or in place
    calls = sum(int(n) for n in re.findall(r"^\s*aten::(?:add)?mm\s.*\s(\d+)\s*$", table,
                                           re.MULTILINE))
    assert calls > 2 * linears, (calls, linears)
