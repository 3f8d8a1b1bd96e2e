"""Every benchmark scenario runs at toy size (the harness is checked here, not the speed)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from bench.__main__ import SCENARIOS

# Three toy runs side by side, of about equal length: the harness is checked, not the speed.
PARTS = (["capacity", "sharding", "privacy", "mixed", "rate", "pacing", "chat", "dpo"],
         ["policies", "memory", "decode", "mixed-trace", "targets", "long-prompts",
          "mixed-lengths", "mixed-idle", "embeddings", "flex"],
         ["throughput", "adapters", "tenants", "coldstart", "together", "overhead", "methods",
          "shapes"])


@pytest.mark.slow
def test_every_scenario_runs_at_toy_size(tmp_path, short_dir) -> None:
    """Every scenario runs, and leaves nothing in the temporary directory (TMPDIR, here a
    directory of the test's own)."""
    assert sorted(name for part in PARTS for name in part) == sorted(SCENARIOS)
    outs = [tmp_path / f"part{i}" / "latest.json" for i in range(len(PARTS))]
    env = {**os.environ, "TMPDIR": str(short_dir)}
    runs = [subprocess.Popen([sys.executable, "-m", "bench", "run", "--toy", "--out", str(out),
                              *part], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
            for out, part in zip(outs, PARTS, strict=True)]
    finished = [run.communicate(timeout=1500) for run in runs]
    scenarios = set()
    for run, (stdout, stderr), out in zip(runs, finished, outs, strict=True):
        assert run.returncode == 0, stderr[-3000:]
        document = json.loads(out.read_text())
        records = document["records"]
        assert not [r for r in records if r["metric"].startswith("FAILED")], stderr[-3000:]
        scenarios |= {r["scenario"].split(" ")[0] for r in records}
        for record in records:
            assert math.isfinite(record["ours"]), record
            assert set(record) >= {"scenario", "metric", "ours", "baseline", "ratio", "goal",
                                   "met"}
        assert "| scenario | metric | ours | baseline | ratio | goal | met |" in stdout
        assert document["machine"]["cores"] >= 1 and document["matmul_peak_gflops"] > 0
    assert len(scenarios) == len(SCENARIOS)
    assert (outs[2].parent / "throughput.png").stat().st_size > 1000
    assert sorted(p.name for p in short_dir.iterdir()) == []
