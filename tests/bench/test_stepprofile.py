"""bench.stepprofile: one fine-tuning step's time split, each side in its own process."""

from __future__ import annotations

import json

from bench.stepprofile import main


def test_a_step_is_split_into_executor_calls_and_the_clients_own_work(tmp_path) -> None:
    out, executor_table = tmp_path / "step.json", tmp_path / "executor.txt"
    assert main(["--model", "tiny-llama", "--length", "16", "--warmup", "1", "--steps", "1",
                 "--out", str(out), "--executor-profile", str(executor_table)]) == 0
    result = json.loads(out.read_text())
    # the measured step's calls only (tiny-llama's step makes 20 today), not the warm-up's too
    assert result["calls"] >= 8
    assert 0 < result["executor_ms"] <= result["calls_ms"] < result["ours_ms"]
    assert result["client_ms"] > 0 and result["plain_ms"] > 0
    assert "_RemoteLinearFn" in result["profile"]
    # the executor's own profile: its base matmuls, which run in the server's thread only
    table = executor_table.read_text()
    assert table.startswith("== by self host time") and "aten::linear" in table
