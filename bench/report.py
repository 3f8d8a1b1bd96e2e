"""`python -m bench report RUN.json [RUN.json ...] [--callpath AFTER.json BEFORE.json]
[--gpu GPU_RUN.json ...] [--gpu-check CHECK.json ...] [--rerun RUN.json ...] [--notes NOTES.md]
[--out bench/RESULTS.md]`: bench/RESULTS.md, generated from results JSON (the GPU runs, the GPU
acceptance runs and scenarios re-run after a change, in sections of their own).

The summary table, which goals are met and which are missed, and the round-trip breakdown are
computed here from the files named on the command line, never written by hand; a goal counts
as met only by the median of the runs in the table. The notes (how to read the figures, where
the time goes) come from a hand-written file and may quote only figures shown in the tables.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from bench.compare import compare, load
from bench.records import Record, fmt, table

HERE = Path(__file__).parent


def meets(goal: str, measured: float | None) -> bool | None:
    if not goal or measured is None or math.isnan(measured):
        return None
    op, value = goal.split()[:2]
    target = float(value.rstrip("x%"))
    return measured >= target if op == ">=" else measured <= target


def median_figure(records: list[Record]) -> float | None:
    """What a goal is judged on: the median ratio (x goals) or the median value (others)."""
    goal = records[0].goal
    values = [r.ratio if goal.split()[1].endswith("x") else r.ours for r in records]
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else None


def goals(paths: list[Path], skip: frozenset[str] = frozenset()) -> tuple[list[str], list[str]]:
    runs = [load(p, skip) for p in paths]
    met, missed = [], []
    firsts: dict[tuple[str, str], Record] = {}  # each row as the first run that has it says
    for run in runs:
        for record in run:
            firsts.setdefault((record.scenario, record.metric), record)
    for first in firsts.values():
        if not first.goal:
            continue
        same = [r for run in runs for r in run
                if (r.scenario, r.metric) == (first.scenario, first.metric)]
        figure = median_figure(same)
        unit = "x" if first.goal.split()[1].endswith("x") else f" {first.unit}"
        line = (f"- {first.scenario}, {first.metric}: {fmt(figure)}{unit} "
                f"(goal {first.goal}, median of {len(same)} run{'s' * (len(same) > 1)})")
        (met if meets(first.goal, figure) else missed).append(line)
    return met, missed


def breakdown(after: dict, before: dict | None) -> str:
    rows = [("round trip, as a client sees it", "round_trip_us"),
            ("round trip with nobody watching shared memory (both sides sleep)",
             "round_trip_blocking_us"),
            ("executor CPU per call (nobody watching)", "executor_cpu_us"),
            ("of which the matmul", "matmul_us"),
            ("client CPU per call (nobody watching)", "client_cpu_us"),
            ("floor: a bare round trip through two pipes", "pipe_round_trip_us")]
    head = f"| | before ({before['date']}) | after ({after['date']}) |" if before else \
        f"| | after ({after['date']}) |"
    lines = [head, "|---|---|---|" if before else "|---|---|"]
    for label, key in rows:
        cells = [before.get(key) if before else None, after.get(key)]
        text = [f"{fmt(c)} us" if c is not None else "-" for c in cells]
        lines.append(f"| {label} | {' | '.join(text if before else text[1:])} |")
    return "\n".join(lines)


def gpu_section(paths: list[Path]) -> list[str]:
    """The runs on a GPU (`bench.scenarios.gpu`): their own table and goals, the device named."""
    meta = json.loads(paths[0].read_text())
    machine = meta["machine"]
    met, missed = goals(paths)
    return ["", "## On a GPU", "",
            f"- **Device**: {machine['gpu']} ({meta['device']}, {meta['dtype']}, clients on "
            f"{meta['worker_device']}), host {machine['cpu']} ({machine['cores']} cores), "
            f"torch {machine['torch']}.",
            "- **Runs**:", *_runs(paths), "", compare(paths), "", "Goals met:", "",
            *(met or ["- none"]), "", "Goals missed:", "", *(missed or ["- none"])]


def check_section(path: Path) -> list[str]:
    """One acceptance run (`python -m bench gpu-check`): its verdict, its tests and each
    scenario stage's records, the device named."""
    check = json.loads(path.read_text())
    machine, stages = check["machine"], check["stages"]
    tests = stages["gpu tests"]
    out = ["", f"## GPU acceptance: {machine['gpu']}, {check['verdict']}", "",
           f"[{path.name}](results/{path.name}): `{check['command']}`, {check['date']}, host "
           f"{machine['cpu']} ({machine['cores']} cores), torch {machine['torch']}.", "",
           f"- **gpu tests**: {tests['passed']} passed, {tests['failed']} failed"
           + (f" ({', '.join(f.split('::')[-1] for f in tests['failures'])})"
              if tests["failures"] else "")
           + f" in {tests['seconds']} s" + (", stopped: out of time" if tests["timed_out"] else "")]
    for name, stage in stages.items():
        if name.startswith("scenarios"):
            asked = stage.get("scenarios")  # named since 2026-11-26's second check
            out.append(f"- **{name}**: {', '.join(stage['scenarios_run']) or 'none'} ran"
                       + (f" of {', '.join(asked)}" if asked else "")
                       + f" in {stage['seconds']} s"
                       + (", stopped: out of time" if stage["timed_out"] else ""))
    for name, stage in stages.items():
        if stage.get("records"):
            records = [Record(**{k: v for k, v in r.items() if k in Record.__dataclass_fields__})
                       for r in stage["records"]]
            out += ["", f"{name}:", "", table(records)]
    return out


def _runs(paths: list[Path]) -> list[str]:
    """One line a run: its file, command, date, length and the host it ran on (runs of one
    report may come from different hosts, whose ratios differ)."""
    lines = []
    for path in paths:
        run = json.loads(path.read_text())
        lines.append(f"  - [{path.name}](results/{path.name}): `{run['command']}`, {run['date']}, "
                     f"{run['elapsed_s'] / 60:.0f} min{_host(run)}")
    return lines


def _host(run: dict) -> str:
    machine = run.get("machine") or {}
    if "cpu" not in machine:
        return ""
    peak = run.get("matmul_peak_gflops")
    return (f", on {machine['cpu']} ({machine.get('cores', '?')} cores"
            + (f", fp32 matmul peak {peak:.0f} GFLOP/s" if peak else "") + ")")


def rerun_section(paths: list[Path]) -> list[str]:
    """Scenarios run again after a change (`--rerun`): their rows replace the main runs'."""
    met, missed = goals(paths)
    return ["", "## Re-run after a change", "",
            "These scenarios were run again after the code they measure changed; their rows in "
            "the runs above are superseded and left out of the summary and the goals there.", "",
            "- **Runs**:", *_runs(paths), "", compare(paths), "", "Goals met:", "",
            *(met or ["- none"]), "", "Goals missed:", "", *(missed or ["- none"])]


def rerun_scenarios(paths: list[Path]) -> frozenset[str]:
    return frozenset(r.scenario for p in paths for r in load(p))


def render(paths: list[Path], callpath: list[Path], notes: Path | None,
           gpu: list[Path] | None = None, rerun: list[Path] | None = None,
           checks: list[Path] | None = None) -> str:
    skip = rerun_scenarios(rerun or [])
    meta = json.loads(paths[0].read_text())
    machine = meta["machine"]
    out = ["# Benchmark results", "",
           f"Generated by `python -m bench report {' '.join(map(str, sys.argv[2:]))}` from the "
           "results JSON; do not edit by hand (the notes at the end come from "
           f"`{notes}`)." if notes else "", "",
           f"- **Machine** (of the first run; each run below names its own): {machine['cpu']} "
           f"({machine['cores']} cores, "
           f"{machine['memory_gb']} GB), torch {machine['torch']}; measured fp32 matmul peak "
           f"{meta['matmul_peak_gflops']:.0f} GFLOP/s.",
           "- **Runs** (the values shown: the first run's that has the row):", *_runs(paths)]
    met, missed = goals(paths, skip)
    out += ["", "## Summary", "", compare(paths, skip), "", "## Goals met", "",
            *(met or ["- none"]), "", "## Goals missed", "", *(missed or ["- none"])]
    if rerun:
        out += rerun_section(rerun)
    if callpath:
        after = json.loads(callpath[0].read_text())
        before = json.loads(callpath[1].read_text()) if len(callpath) > 1 else None
        out += ["", "## Where a 1-row round trip's time goes", "",
                f"`python -m bench.callpath` ({callpath[0].name}"
                + (f"; before: {callpath[1].name}, the same script on the code before the call "
                   "path work" if before else "") + "):", "", breakdown(after, before)]
    if gpu:
        out += gpu_section(gpu)
    for check in checks or []:
        out += check_section(check)
    if notes:
        out += ["", notes.read_text().strip()]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench report")
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--callpath", nargs="+", type=Path, default=[])
    parser.add_argument("--gpu", nargs="+", type=Path, default=[],
                        help="runs of the GPU scenarios (python -m bench run --device cuda)")
    parser.add_argument("--gpu-check", nargs="+", type=Path, default=[],
                        help="acceptance runs (python -m bench gpu-check), one section each")
    parser.add_argument("--rerun", nargs="+", type=Path, default=[],
                        help="runs of some scenarios after a change: they supersede those "
                             "scenarios' rows in the main runs")
    parser.add_argument("--notes", type=Path, default=HERE / "NOTES.md")
    parser.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    args = parser.parse_args(argv)
    notes = args.notes if args.notes.exists() else None
    args.out.write_text(render(args.runs, args.callpath, notes, args.gpu, args.rerun,
                                    args.gpu_check))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
