"""The tree's boundaries: which package may import which, and which processes stay torch-free.

The link formats (`wire`) and the model catalogue import no process code; each process package
imports only what sits below it; nothing imports the launcher; the gateway, the worker manager,
the launcher and the state import no torch (checked by importing them in a fresh interpreter).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = {"wire", "catalogue", "executor", "workers", "gateway", "launcher", "state", "openapi",
           "bench"}
ALLOWED = {  # package -> project packages it may import (besides itself)
    "wire": set(),
    "catalogue": set(),
    "state": {"wire"},  # e.g. a job's spec and status, stored as the links carry them
    "openapi": set(),
    "executor": {"wire", "catalogue"},
    "workers": {"wire", "catalogue", "state"},
    "gateway": {"wire", "catalogue", "state", "openapi"},
    "launcher": {"gateway", "state", "wire", "catalogue", "workers"},  # workers.manager: records
    "bench": {"wire", "catalogue", "executor", "workers", "state", "launcher"},
}
TORCH_FREE = ["wire/manager.py", "catalogue/paths.py", "catalogue/builtin.py", "gateway",
              "workers/manager", "launcher", "state", "openapi"]


def imports_of(path: Path) -> set[str]:
    """Top-level project packages a module imports, at any depth of the module (lazy ones too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & PROJECT


def modules(place: str) -> list[Path]:
    path = ROOT / place
    return [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))


def violations(allowed: dict[str, set[str]]) -> list[str]:
    wrong = []
    for package, may in allowed.items():
        for path in modules(package):
            for target in imports_of(path) - may - {package}:
                wrong.append(f"{path.relative_to(ROOT)} imports {target}")
    return wrong


def test_each_package_imports_only_what_sits_below_it() -> None:
    assert violations(ALLOWED) == []


def test_the_check_catches_an_upward_import(tmp_path, monkeypatch) -> None:
    """The rule is live: a wire module importing the executor's server would be reported."""
    fake = tmp_path / "wire"
    fake.mkdir()
    (fake / "bad.py").write_text("from executor.server import ExecutorServer\n")
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "bad.py").write_text("def f():\n    import workers.remote\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert sorted(violations({"wire": set(), "gateway": {"wire"}})) == [
        "gateway/bad.py imports workers", "wire/bad.py imports executor"]


def test_nothing_imports_the_launcher() -> None:
    importers = [str(p.relative_to(ROOT)) for package in PROJECT - {"launcher", "bench"}
                 for p in modules(package) if "launcher" in imports_of(p)]
    assert importers == []


def dotted(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("place", TORCH_FREE)
def test_torch_free_places_import_no_torch(place: str) -> None:
    names = [dotted(p) for p in modules(place) if p.name != "__main__.py"]
    code = (f"import importlib, sys\nfor name in {names!r}:\n    importlib.import_module(name)\n"
            "heavy = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]\n"
            "sys.exit(f'imported {heavy}' if heavy else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr[-2000:]
