"""Every benchmark scenario runs at toy size (the harness is checked here, not the speed)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from bench.__main__ import SCENARIOS


@pytest.mark.slow
def test_every_scenario_runs_at_toy_size(tmp_path) -> None:
    out = tmp_path / "latest.json"
    run = subprocess.run([sys.executable, "-m", "bench", "run", "--toy", "--out", str(out)],
                         capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stderr[-3000:]
    document = json.loads(out.read_text())
    records = document["records"]
    assert not [r for r in records if r["metric"].startswith("FAILED")], run.stderr[-3000:]
    scenarios = {r["scenario"].split(" ")[0] for r in records}
    assert len(scenarios) == len(SCENARIOS)
    for record in records:
        assert math.isfinite(record["ours"]), record
        assert set(record) >= {"scenario", "metric", "ours", "baseline", "ratio", "goal", "met"}
    assert "| scenario | metric | ours | baseline | ratio | goal | met |" in run.stdout
    assert (tmp_path / "throughput.png").stat().st_size > 1000
    assert document["machine"]["cores"] >= 1 and document["matmul_peak_gflops"] > 0
