"""`python -m bench compare RUN.json [RUN.json ...]`: several runs side by side, one row per
metric: the first run's values, every run's ratio, the median ratio, and whether each met its
goal (this box is noisy: read the median, not one run)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench.records import Record, fmt


def load(path: Path, skip: frozenset[str] = frozenset()) -> list[Record]:
    """A run's records, but those of the scenarios in `skip`."""
    fields = Record.__dataclass_fields__
    return [Record(**{k: v for k, v in r.items() if k in fields})
            for r in json.loads(path.read_text())["records"] if r["scenario"] not in skip]


def compare(paths: list[Path], skip: frozenset[str] = frozenset()) -> str:
    runs = [{(r.scenario, r.metric): r for r in load(p, skip)} for p in paths]
    names = " / ".join(p.stem for p in paths)
    lines = [f"| scenario | metric | ours | baseline | ratio ({names}) | median ratio | goal | "
             "met |", "|---|---|---|---|---|---|---|---|"]
    keys = list(dict.fromkeys(key for run in runs for key in run))  # rows of any run, in order
    for key in keys:
        same = [run.get(key) for run in runs]
        first = next(r for r in same if r is not None)  # the values shown: the first run's
        ratios = [r.ratio for r in same if r is not None and r.ratio is not None]
        median = statistics.median(ratios) if ratios else None
        mets = ["-" if r is None or r.met is None else "yes" if r.met else "no" for r in same]
        unit = f" {first.unit}" if first.unit else ""
        lines.append(
            f"| {first.scenario} | {first.metric} | {fmt(first.ours)}{unit} | "
            f"{fmt(first.baseline)}{unit if first.baseline is not None else ''} | "
            + " / ".join("-" if r is None or r.ratio is None else f"{r.ratio:.2f}x"
                         for r in same)
            + f" | {'-' if median is None else f'{median:.2f}x'} | {first.goal} | "
            + ("" if not first.goal else " / ".join(mets)) + " |")
    return "\n".join(lines)
