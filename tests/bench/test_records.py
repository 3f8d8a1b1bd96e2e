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
