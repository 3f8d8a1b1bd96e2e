"""Benchmark records: ratios and goals."""

from __future__ import annotations

import math

from bench.records import Record, table


def test_ratio_goals_and_absolute_goals() -> None:
    assert Record("s", "m", 30.0, 10.0, goal=">= 3.0x").met is True
    assert Record("s", "m", 29.0, 10.0, goal=">= 3.0x").met is False
    assert Record("s", "m", 1.0, 5.0, goal="<= 0.25x").met is True  # 5x less memory
    assert Record("s", "m", 90.0, None, goal="<= 100 us").met is True
    assert Record("s", "m", 85.0, None, goal=">= 80 %").met is True
    assert Record("s", "m", 3.0, None).met is None and Record("s", "m", 3.0, None).ratio is None
    assert Record("s", "m", math.nan, 2.0, goal=">= 1.0x").met is None


def test_table_marks_missed_goals() -> None:
    text = table([Record("4 decode", "tokens/s", 10.0, 20.0, "tok/s", ">= 3.0x")])
    assert "| 4 decode | tokens/s | 10 tok/s | 20 tok/s | 0.50x | >= 3.0x | **no** |" in text


def test_compare_puts_runs_side_by_side_with_the_median(tmp_path) -> None:
    from bench.compare import compare
    from bench.records import write_json

    runs = []
    for i, ours in enumerate((10.0, 40.0, 25.0)):
        path = tmp_path / f"run{i}.json"
        write_json(path, [Record("4 decode", "tokens/s", ours, 10.0, "tok/s", ">= 2.0x")]
                   + ([Record("8 overhead", "us", 90.0, None, "us", "<= 100 us")] if i == 0
                      else []), {})
        runs.append(path)
    lines = compare(runs).splitlines()
    assert lines[0].startswith("| scenario | metric | ours | baseline | ratio (run0 / run1 / run2)")
    assert lines[2] == ("| 4 decode | tokens/s | 10 tok/s | 10 tok/s | 1.00x / 4.00x / 2.50x | "
                        "2.50x | >= 2.0x | no / yes / yes |")
    assert lines[3] == "| 8 overhead | us | 90 us | - | - / - / - | - | <= 100 us | yes / - / - |"


def test_the_report_judges_goals_by_the_median_of_the_runs(tmp_path) -> None:
    import json

    from bench.records import write_json
    from bench.report import render

    meta = {"command": "python -m bench run --quick", "date": "2026-11-23 12:00",
            "elapsed_s": 540.0, "matmul_peak_gflops": 150.0,
            "machine": {"cpu": "test CPU", "cores": 2, "memory_gb": 24, "torch": "2.13"}}
    runs = []
    for i, (ours, rtt) in enumerate(((10.0, 120.0), (40.0, 80.0), (25.0, 90.0))):
        path = tmp_path / f"run{i}.json"
        write_json(path, [Record("4 decode", "tokens/s", ours, 10.0, "tok/s", ">= 2.0x"),
                          Record("8 overhead", "round trip", rtt, None, "us", "<= 100 us"),
                          Record("3 training", "tokens/s", 5.0, 10.0, "tok/s", ">= 1.0x")], meta)
        runs.append(path)
    after, before = tmp_path / "after.json", tmp_path / "before.json"
    after.write_text(json.dumps({"date": "d2", "round_trip_us": 62.0, "matmul_us": 5.0}))
    before.write_text(json.dumps({"date": "d1", "round_trip_us": 211.0, "matmul_us": 5.0}))
    notes = tmp_path / "notes.md"
    notes.write_text("## Notes\n\nHand-written.")
    text = render(runs, [after, before], notes)
    met = text.split("## Goals met")[1].split("## Goals missed")[0]
    missed = text.split("## Goals missed")[1].split("## Where")[0]
    assert "4 decode, tokens/s: 2.5x (goal >= 2.0x, median of 3 runs)" in met
    assert "8 overhead, round trip: 90 us (goal <= 100 us, median of 3 runs)" in met
    assert "3 training, tokens/s: 0.5x" in missed and "4 decode" not in missed
    assert "| round trip, as a client sees it | 211 us | 62 us |" in text
    assert text.rstrip().endswith("Hand-written.")


def test_the_report_gives_gpu_runs_their_own_section_with_the_device_named(tmp_path) -> None:
    from bench.records import write_json
    from bench.report import render

    machine = {"cpu": "host CPU", "cores": 16, "memory_gb": 128, "torch": "2.13",
               "gpu": "NVIDIA H100 80GB HBM3"}
    meta = {"command": "python -m bench run", "date": "2026-11-24 12:00", "elapsed_s": 60.0,
            "matmul_peak_gflops": 150.0, "machine": machine}
    cpu, gpu = tmp_path / "cpu.json", tmp_path / "gpu.json"
    write_json(cpu, [Record("4 decode", "tokens/s", 20.0, 10.0, "tok/s", ">= 1.5x")], meta)
    write_json(gpu, [Record("12 GPU decode", "32 tenants: tokens/s", 450.0, None, "tok/s",
                            ">= 400 tok/s"),
                     Record("12 GPU fine-tuning", "2x512, N=8: tokens/s", 30e3, 36e3, "tok/s",
                            ">= 1.2x")],
               {**meta, "device": "cuda", "dtype": "bfloat16", "worker_device": "cuda"})
    text = render([cpu], [], None, [gpu])
    section = text.split("## On a GPU")[1]
    assert "NVIDIA H100 80GB HBM3 (cuda, bfloat16, clients on cuda)" in section
    met, missed = section.split("Goals met:")[1].split("Goals missed:")
    assert "12 GPU decode, 32 tenants: tokens/s: 450 tok/s (goal >= 400 tok/s" in met
    assert "12 GPU fine-tuning, 2x512, N=8: tokens/s: 0.833x (goal >= 1.2x" in missed
    assert "12 GPU" not in text.split("## On a GPU")[0]  # the CPU summary keeps to CPU runs


def test_a_rerun_scenario_replaces_its_rows_in_the_main_runs(tmp_path) -> None:
    from bench.records import write_json
    from bench.report import render

    meta = {"command": "python -m bench run --quick", "date": "2026-11-24 12:00",
            "elapsed_s": 60.0, "matmul_peak_gflops": 150.0,
            "machine": {"cpu": "test CPU", "cores": 2, "memory_gb": 24, "torch": "2.13"}}
    main, again = tmp_path / "main.json", tmp_path / "privacy-again.json"
    write_json(main, [Record("4 decode", "tokens/s", 20.0, 10.0, "tok/s", ">= 1.5x"),
                      Record("7 privacy", "decode", 3.0, 10.0, "tok/s", ">= 0.5x")], meta)
    write_json(again, [Record("7 privacy", "decode", 6.0, 10.0, "tok/s", ">= 0.5x")], meta)
    text = render([main], [], None, rerun=[again])
    before, section = text.split("## Re-run after a change")
    assert "7 privacy" not in before and "4 decode, tokens/s: 2x" in before
    assert "[privacy-again.json](results/privacy-again.json)" in section
    assert "| 7 privacy | decode | 6 tok/s | 10 tok/s | 0.60x | 0.60x | >= 0.5x | yes |" in section
    assert "7 privacy, decode: 0.6x (goal >= 0.5x, median of 1 run)" in section.split(
        "Goals met:")[1].split("Goals missed:")[0]


def test_each_run_names_the_host_it_ran_on(tmp_path) -> None:
    """Runs of one report come from different hosts (ratios differ between them): each run's
    line says which, the main runs' and the re-runs' alike."""
    from bench.records import write_json
    from bench.report import render

    def meta(cpu: str, peak: float) -> dict:
        return {"command": "python -m bench run --quick", "date": "2026-11-30 06:00",
                "elapsed_s": 120.0, "matmul_peak_gflops": peak,
                "machine": {"cpu": cpu, "cores": 2, "memory_gb": 24, "torch": "2.13"}}

    main, again = tmp_path / "main.json", tmp_path / "throughput-again.json"
    write_json(main, [Record("4 decode", "tokens/s", 20.0, 10.0, "tok/s", ">= 1.5x")],
               meta("AMD EPYC", 201.2))
    write_json(again, [Record("3 fine-tuning", "N=1", 9.0, 10.0, "tok/s", ">= 0.87x")],
               meta("Intel(R) Xeon(R) Processor", 341.0))
    text = render([main], [], None, rerun=[again])
    assert ("[main.json](results/main.json): `python -m bench run --quick`, 2026-11-30 06:00, "
            "2 min, on AMD EPYC (2 cores, fp32 matmul peak 201 GFLOP/s)") in text
    assert ("[throughput-again.json](results/throughput-again.json): `python -m bench run "
            "--quick`, 2026-11-30 06:00, 2 min, on Intel(R) Xeon(R) Processor (2 cores, fp32 "
            "matmul peak 341 GFLOP/s)") in text.split("## Re-run after a change")[1]
    assert "- **Machine** (of the first run; each run below names its own): AMD EPYC" in text


def test_an_acceptance_run_gets_its_section_with_verdict_failures_and_stopped_stages(
        tmp_path) -> None:
    import json

    from bench.records import write_json
    from bench.report import render

    machine = {"cpu": "host CPU", "cores": 16, "memory_gb": 128, "torch": "2.11",
               "gpu": "NVIDIA H100 80GB HBM3"}
    cpu = tmp_path / "cpu.json"
    write_json(cpu, [Record("4 decode", "tokens/s", 20.0, 10.0, "tok/s", ">= 1.5x")],
               {"command": "python -m bench run", "date": "2026-11-26 12:00", "elapsed_s": 60.0,
                "matmul_peak_gflops": 150.0, "machine": machine})
    decode = Record("12 GPU decode", "32 tenants: tokens/s", 80.0, None, "tok/s", ">= 400 tok/s")
    check = tmp_path / "check.json"
    check.write_text(json.dumps({
        "command": "python -m bench gpu-check", "date": "2026-11-26 11:16", "machine": machine,
        "verdict": "refused", "stages": {
            "gpu tests": {"passed": 3, "failed": 1, "seconds": 126.2, "timed_out": True,
                          "failures": ["tests/x.py::test_bf16[bfloat16]"]},
            "scenarios without MPS": {"scenarios": ["gpu-decode", "gpu-long"], "seconds": 176.3,
                                      "scenarios_run": ["12 GPU decode"], "timed_out": True,
                                      "records": [decode.as_dict()]}}}))
    section = render([cpu], [], None, checks=[check]).split(
        "## GPU acceptance: NVIDIA H100 80GB HBM3, refused")[1]
    assert "3 passed, 1 failed (test_bf16[bfloat16]) in 126.2 s, stopped: out of time" in section
    assert "12 GPU decode ran of gpu-decode, gpu-long in 176.3 s, stopped" in section
    assert "| 12 GPU decode | 32 tenants: tokens/s | 80 tok/s | - | - | >= 400 tok/s | **no** |" \
        in section
