"""The GPU scenarios' harness: nvidia-smi's samples read right, the jobs-that-fit projection, and
the three scenarios run end to end (here on the CPU at toy size; on a GPU when one is present)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from bench.gpu import GpuReading, GpuSample, GpuSampler, parse_sample
from bench.scenarios.gpu import GPU_SCENARIOS, fits


def test_a_sample_line_is_read_and_others_are_skipped() -> None:
    assert parse_sample("40536, 81559, 97\n") == GpuSample(40536.0, 81559.0, 97.0)
    assert parse_sample("[N/A], 81559, 0") is None
    assert parse_sample("") is None
    reading = GpuReading([GpuSample(1000, 80000, 50), GpuSample(3000, 80000, 100)])
    assert (reading.peak_used_mb, reading.total_mb, reading.mean_busy_percent) == \
        (3000, 80000, 75)
    assert GpuReading().peak_used_mb is None and GpuReading().mean_busy_percent is None


def test_the_sampler_reads_nvidia_smis_stream(tmp_path, monkeypatch) -> None:
    """A stand-in `nvidia-smi` that answers the sampler's query as the real one prints it."""
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n"
                      'case "$*" in *"--query-gpu=memory.used,memory.total,utilization.gpu'
                      ' --format=csv,noheader,nounits -i 0 --loop-ms=50"*) ;; *) exit 2;; esac\n'
                      'echo "100, 81559, 10"; echo "[N/A], 81559, 0"; echo "300, 81559, 30"\n'
                      "exec sleep 60\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert GpuSampler.available()
    with GpuSampler(period_ms=50) as sampler:
        deadline = time.monotonic() + 10
        while len(sampler.reading.samples) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert sampler.reading.peak_used_mb == 300 and sampler.reading.mean_busy_percent == 20


def test_mps_for_a_run_starts_a_daemon_the_runs_processes_find_and_stops_it(
        tmp_path, monkeypatch) -> None:
    from bench.gpu import mps
    from tests.launcher.test_mps import calls, stand_in_control

    control = stand_in_control(tmp_path)
    scratch = tmp_path / "scratch"  # where the run's temporary directories go
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("PATH", f"{control}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "pipes"))
    monkeypatch.setenv("CUDA_MPS_LOG_DIRECTORY", "")  # restored (unset) after the test
    with mps(True) as on:
        assert on and os.environ["CUDA_MPS_LOG_DIRECTORY"]  # children inherit where it is
    assert [c["args"] for c in calls(tmp_path)] == [["-d"], []]
    assert not (tmp_path / "pipes" / "control").exists()  # it quit
    (tmp_path / "pipes" / "control").touch()  # one already serves: used, not started
    with mps(True) as on:
        assert on
    assert len(calls(tmp_path)) == 2
    with mps(False) as on:
        assert not on
    assert list(scratch.iterdir()) == []  # the daemon's log directory went with it


def test_jobs_that_fit_are_projected_from_the_peaks_at_one_and_many() -> None:
    # 3 GB for one job, 10 GB for eight: 1 GB per job on a fixed 2 GB; 80 GB holds 78
    assert fits(3.0, 10.0, 8, 80.0) == 78
    assert fits(3.0, 10.0, 8, 1.0) == 0


def _run_toy(tmp_path, device: str) -> dict:
    out = tmp_path / "gpu.json"
    run = subprocess.run([sys.executable, "-m", "bench", "run", "--toy", "--device", device,
                          "--out", str(out), *GPU_SCENARIOS], capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    document = json.loads(out.read_text())
    records = document["records"]
    assert not [r for r in records if r["metric"].startswith("FAILED")], run.stderr[-3000:]
    scenarios = {r["scenario"] for r in records}
    assert scenarios == {"12 GPU fine-tuning", "12 GPU decode", "12 GPU long context"}
    for record in records:
        assert math.isfinite(record["ours"]) and record["ours"] > 0, record
    return document


def test_gpu_check_on_a_host_without_a_gpu_says_so_and_exits_2(tmp_path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    out = tmp_path / "check.json"
    run = subprocess.run([sys.executable, "-m", "bench", "gpu-check", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "no usable CUDA device" in run.stderr and "nothing was run" in run.stderr
    assert not out.exists()


@pytest.mark.slow
def test_gpu_check_runs_every_stage_on_a_cpu_at_toy_size(tmp_path) -> None:
    """The acceptance command's own stages, on the CPU: the gpu-marked tests it is pointed at
    (skipped here), the GPU scenarios without MPS and under a (stand-in) MPS daemon, one JSON."""
    from tests.launcher.test_mps import calls, stand_in_control

    control = stand_in_control(tmp_path)
    out = tmp_path / "check.json"
    env = {**os.environ, "PATH": f"{control}{os.pathsep}{os.environ['PATH']}",
           "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipes")}
    run = subprocess.run([sys.executable, "-m", "bench", "gpu-check", "--device", "cpu", "--toy",
                          "--tests", "tests/wire/call/test_device.py", "--out", str(out),
                          "--logs", str(tmp_path / "logs")],
                         capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["verdict"] == "harness check passed (no GPU)"
    assert (document["device"], document["device_name"]) == ("cpu", "cpu")
    tests = document["stages"]["gpu tests"]
    assert (tests["passed"], tests["failed"], tests["skipped"]) == (0, 0, 1)
    passes = (("scenarios without MPS", False, {"12 GPU fine-tuning", "12 GPU long context"}),
              ("scenarios under MPS", True, {"12 GPU decode"}))  # MPS: many decode processes
    for name, mps, scenarios in passes:
        stage = document["stages"][name]
        assert stage["mps"] is mps and stage["exit_code"] == 0 and not stage["failed"], stage
        assert set(stage["scenarios_run"]) == scenarios
        for record in stage["records"]:
            assert math.isfinite(record["ours"]) and record["ours"] > 0, record
        memory = [r for r in stage["records"] if r["metric"].endswith("peak memory")]
        assert memory and all(r["note"] == "host PSS (no GPU in this run)" for r in memory)
        assert not [r for r in stage["records"] if "GPU busy" in r["metric"]]
        batching = [r["ours"] for r in stage["records"]
                    if r["metric"].endswith("decode calls per executor batch")]
        assert len(batching) == mps and all(b >= 1 for b in batching)  # the decode lane
    assert [c["args"] for c in calls(tmp_path)] == [["-d"], []]  # started and quit once
    logs = {path.name: path.read_text() for path in (tmp_path / "logs").iterdir()}
    assert set(logs) == {"gpu-tests.log", "scenarios.log", "scenarios-mps.log"}
    assert "test_device.py" in logs["gpu-tests.log"]  # each stage's whole output, kept
    assert "== gpu-long" in logs["scenarios.log"] and "== gpu-decode" in logs["scenarios-mps.log"]
    assert tests["output_tail"] == logs["gpu-tests.log"][-len(tests["output_tail"]):]
    assert "verdict: harness check passed (no GPU)" in run.stdout


@pytest.mark.gpu
def test_the_gpu_scenarios_measure_the_gpu(tmp_path) -> None:
    document = _run_toy(tmp_path, "cuda")
    assert (document["device"], document["dtype"]) == ("cuda", "bfloat16")
    assert document["machine"]["gpu"]
    memory = [r for r in document["records"] if r["metric"].endswith("peak memory")]
    assert memory and all(r["note"] == "GPU memory (nvidia-smi)" for r in memory)
    busy = [r for r in document["records"] if "GPU busy" in r["metric"]]
    assert len(busy) == 1 and 0 <= busy[0]["ours"] <= 100


def test_gpu_check_runs_every_gpu_scenario_in_one_of_its_passes() -> None:
    from bench.gpucheck import PASSES
    from bench.scenarios.gpu import GPU_SCENARIOS

    assert sorted(PASSES[False] + PASSES[True]) == sorted(GPU_SCENARIOS)


def test_gpu_check_collects_the_gpu_marked_files_without_the_bench_harness() -> None:
    from bench.gpucheck import gpu_test_files

    assert gpu_test_files(Path("tests")) == [
        "tests/executor/test_engine.py", "tests/executor/test_in_place.py",
        "tests/wire/call/test_device.py",
        "tests/wire/call/test_digits.py", "tests/workers/inference/test_adapter_chunks.py",
        "tests/workers/inference/test_adapters.py",
        "tests/workers/inference/test_embedding.py",
        "tests/workers/inference/test_packed.py", "tests/workers/inference/test_placement.py",
        "tests/workers/inference/test_row_attention.py",
        "tests/workers/remote/test_gpu_clients.py", "tests/workers/remote/test_kept_rows.py",
        "tests/workers/remote/test_loss.py",
        "tests/workers/remote/test_parts.py",
        "tests/workers/remote/test_stretch.py",
        "tests/workers/remote/test_tail.py",
        "tests/workers/remote/test_transport.py", "tests/workers/training/test_lean.py",
        "tests/workers/training/test_preference.py"]


def test_a_stopped_test_stage_is_counted_from_pytests_verbose_lines(tmp_path) -> None:
    """When pytest is stopped before its JUnit report, its `-v` lines give the same counts as
    the report of a run that finished."""
    from bench.gpucheck import _counts, pytest_command

    (tmp_path / "test_three.py").write_text(
        "import pytest\n"
        "pytestmark = pytest.mark.chosen\n"
        "def test_passes():\n    assert True\n"
        "def test_fails():\n    assert False\n"
        "def test_skips():\n    pytest.skip('no')\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers = chosen: for this test\n")
    junit = tmp_path / "junit.xml"
    run = subprocess.run(pytest_command([str(tmp_path / "test_three.py")], junit, "chosen"),
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    from_report = _counts(junit, "")
    from_lines = _counts(tmp_path / "absent.xml", run.stdout)
    assert (from_report["passed"], from_report["failed"], from_report["skipped"]) == (1, 1, 1)
    assert {k: from_lines[k] for k in ("passed", "failed", "skipped")} == \
        {k: from_report[k] for k in ("passed", "failed", "skipped")}
    assert [name.split("::")[-1] for name in from_lines["failures"]] == ["test_fails"]


def test_a_stage_out_of_time_says_what_failed_and_leaves_no_process_behind(
        tmp_path, monkeypatch) -> None:
    """A hung test: pytest is interrupted and still prints the failures so far (the H100's
    first check lost them when the stage was killed), then whatever the stage started dies. Also
    when this process ignores SIGINT, as a command started in a shell's background does."""
    import bench.gpucheck as check

    pid_file = tmp_path / "child.pid"
    (tmp_path / "test_hangs.py").write_text(
        "import pytest, subprocess, time\n"
        "pytestmark = pytest.mark.chosen\n"
        "def test_fails():\n    assert 1 == 2, 'the failure to keep'\n"
        "def test_hangs():\n"
        "    child = subprocess.Popen(['sleep', '600'])\n"
        f"    open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "    time.sleep(600)\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers = chosen: for this test\n")
    monkeypatch.setattr(check, "GRACE_S", 6)
    monkeypatch.chdir(tmp_path)
    command = check.pytest_command([str(tmp_path / "test_hangs.py")], tmp_path / "j.xml",
                                   "chosen")
    started = time.monotonic()
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a shell's background job
    try:
        code, out, _ = check.run_stage(command, 18)
    finally:
        signal.signal(signal.SIGINT, ignored)
    # out of time at 18 s, then interrupted and given 6 s: never the 600 s its test sleeps
    assert code is None and time.monotonic() - started < 18 + 6 + 6
    assert "FAILED" in out and "the failure to keep" in out
    child = int(pid_file.read_text())
    time.sleep(0.5)
    assert not Path(f"/proc/{child}").exists() or \
        Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"  # gone, or a zombie of init


def test_an_mps_pass_on_a_host_without_mps_is_a_failed_stage_not_a_crash(
        tmp_path, monkeypatch) -> None:
    import argparse

    import bench.gpucheck as check

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-cuda-mps-control
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "pipes"))
    args = argparse.Namespace(device="cpu", toy=True)
    stage = check.scenarios(args, True, time.monotonic() + 60, 1.0)
    assert stage["exit_code"] == 1 and stage["scenarios_run"] == []
    assert "no nvidia-cuda-mps-control" in stage["stderr_tail"]
    assert check.verdict({"device": "cuda", "stages": {
        "gpu tests": {"failed": 0, "timed_out": False, "passed": 9, "exit_code": 0},
        "scenarios under MPS": stage}}) == "refused"
