"""The environment is read only by settings objects (pydantic-settings classes), never by
ad-hoc lookups scattered through the code: a grep over the shipped packages."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("catalogue", "executor", "gateway", "launcher", "openapi", "state", "wire", "workers")
READS = re.compile(r"os\.environ\.get\(|os\.environ\[|os\.getenv\(|environ\.get\(")
# `symbiosis serve` sets every service's variables from its flags: its flags' defaults are the
# variables already set, looked up by the names its settings table lists
SETTINGS_TABLE = ROOT / "launcher" / "serve_flags.py"


def test_no_module_reads_the_environment_outside_a_settings_object() -> None:
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path == SETTINGS_TABLE:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if READS.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_grep_finds_a_read() -> None:
    assert READS.search('x = os.environ.get("SYMBIOSIS_SHM_DIR", "/dev/shm")')
    assert READS.search('os.environ["SYMBIOSIS_MANAGER"]')
    assert not READS.search('os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")')
