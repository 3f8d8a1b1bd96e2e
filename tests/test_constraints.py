"""CI's pinned versions (.ci/constraints.txt) against pyproject.toml's ranges: every package the
project and its test extra name is pinned there, once, at a version its range admits (torch
aside: .ci/run pins it itself, as the README's commands do), and .ci/run installs with them."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).parents[1]
CONSTRAINTS = ROOT / ".ci" / "constraints.txt"


def pinned() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not a pin: {line}"
            assert canonicalize_name(name) not in pins, f"pinned twice: {name}"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def named() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in
            (*project["dependencies"], *project["optional-dependencies"]["test"])]


def test_every_requirement_is_pinned_at_a_version_its_range_admits() -> None:
    pins, wrong = pinned(), []
    for requirement in named():
        name = canonicalize_name(requirement.name)
        if name == "torch":
            assert name not in pins  # the CPU wheel, pinned by .ci/run's own install
            continue
        if name not in pins or not requirement.specifier.contains(pins[name]):
            wrong.append(f"{requirement}: {pins.get(name, 'not pinned')}")
    assert not wrong, wrong


def test_ci_installs_with_the_pins() -> None:
    run = (ROOT / ".ci" / "run").read_text()
    assert 'pip install --quiet -c .ci/constraints.txt -e ".[test]"' in run
