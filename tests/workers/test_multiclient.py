"""Several client processes train different adapters at once against one executor process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.peft_reference import TOLERANCE


@pytest.mark.slow
def test_four_processes_train_different_methods_at_once(executor_for) -> None:
    endpoint = executor_for("tiny-llama").endpoint
    methods = ["lora", "ia3", "adalora", "prefix_tuning"]
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.workers.train_client", "--endpoint",
                          endpoint, "--model", "tiny-llama", "--method", method, "--seed",
                          str(seed), "--steps", "5"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
        for seed, method in enumerate(methods)
    ]
    for method, proc in zip(methods, procs, strict=True):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{method} client failed:\n{err[-3000:]}"
        result = json.loads(out.strip().splitlines()[-1])
        assert max(result["logits"], result["grads"], result["params"]) <= TOLERANCE, \
            (method, result)
        assert result["generate_equal"], method
