"""Benchmark records (ours vs baseline, as ratios), the markdown table and the JSON file."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Record:
    scenario: str
    metric: str
    ours: float
    baseline: float | None
    unit: str = ""
    goal: str = ""  # e.g. ">= 3.0x", "<= 100 us"
    higher_is_better: bool = True
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline in (None, 0) or self.ours is None:
            return None
        return self.ours / self.baseline

    @property
    def met(self) -> bool | None:
        if not self.goal:
            return None
        op, value = self.goal.split()[:2]
        target = float(value.rstrip("x%"))
        measured = self.ratio if value.endswith("x") else self.ours
        if measured is None or math.isnan(measured):
            return None
        return measured >= target if op == ">=" else measured <= target

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio, "met": self.met}


def fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def table(records: list[Record]) -> str:
    lines = ["| scenario | metric | ours | baseline | ratio | goal | met |",
             "|---|---|---|---|---|---|---|"]
    for r in records:
        met = {True: "yes", False: "**no**", None: ""}[r.met]
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        unit = f" {r.unit}" if r.unit else ""
        lines.append(f"| {r.scenario} | {r.metric} | {fmt(r.ours)}{unit} | "
                     f"{fmt(r.baseline)}{unit if r.baseline is not None else ''} | {ratio} | "
                     f"{r.goal} | {met} |")
    return "\n".join(lines)


def write_json(path: Path, records: list[Record], meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, "records": [r.as_dict() for r in records]}, indent=1))
