"""`symbiosis serve` and the README agree: every variable of the configuration table is a flag
of `serve` (or is variable-only for a stated reason), every flag has a line of help and sets the
variable the services' settings read, and the README's prose names only flags and variables
that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from gateway.settings import GatewaySettings
from launcher import serve_flags
from launcher.cli import parser
from workers.manager.config import ManagerConfig
from workers.manager.pool import WorkerHandle
from workers.manager.specs import worker_spec

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()


def _table_variables() -> set[str]:
    section = README[README.index("| variable | default | used by | meaning |"):]
    rows = [line for line in section.splitlines()[2:] if line.startswith("|")][:200]
    found = set()
    for row in rows[:next((i for i, r in enumerate(rows) if not r.startswith("| `")),
                          len(rows))]:
        names = re.findall(r"`(SYMBIOSIS_[A-Z_]+|_[A-Z_]+)`", row.split("|")[1])
        prefix = "_".join(names[0].split("_")[:2])
        found |= {n if n.startswith("SYMBIOSIS") else prefix + n for n in names}
    return found


def test_every_variable_of_the_table_is_a_flag_or_says_why_not() -> None:
    variables = _table_variables()
    assert {"SYMBIOSIS_MAX_WORKERS", "SYMBIOSIS_EXECUTOR_DEVICE", "SYMBIOSIS_MPS"} <= variables
    flags = {s.variable for s in serve_flags.SETTINGS}
    assert variables - flags - set(serve_flags.ENV_ONLY) == set()
    assert flags - variables == set(), "flags the README's table does not describe"


def test_every_flag_has_help_and_sets_what_the_services_read(monkeypatch) -> None:
    help_text = subprocess.run([sys.executable, "-m", "launcher", "serve", "--help"],
                               capture_output=True, text=True, timeout=120).stdout
    for setting in serve_flags.SETTINGS:
        assert setting.flag in help_text and setting.variable in help_text
    args = parser().parse_args(["serve", "--max-workers", "3", "--max-batch", "12",
                                "--idle-s", "7.5", "--max-concurrent", "5", "--privacy", "true",
                                "--pin", "acme", "--device", "cpu"])
    env = serve_flags.environment(args)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    manager = ManagerConfig()
    assert (manager.max_workers, manager.max_batch, manager.idle_s, manager.privacy) == \
        (3, 12, 7.5, True)
    assert GatewaySettings().max_concurrent == 5
    assert env["SYMBIOSIS_EXECUTOR_DEVICE"] == "cpu" and args.pin == ["acme"]


def test_adapter_cache_flags_reach_the_workers_spec(monkeypatch) -> None:
    args = parser().parse_args(["serve", "--adapter-cache-mb", "64", "--tenant-adapter-cache-mb",
                                "0.5", "--max-adapters", "100", "--prefill-chunk-tokens", "96"])
    for variable, value in serve_flags.environment(args).items():
        monkeypatch.setenv(variable, value)
    spec = worker_spec(ManagerConfig(), "ipc:///manager", WorkerHandle("~shared-0", "~shared-0",
                                                                      started=0.0))
    assert (spec.max_adapters, spec.adapter_bytes, spec.tenant_adapter_bytes) == \
        (100, 64 * 2**20, 2**19)
    assert spec.prefill_chunk_tokens == 96


def test_the_readme_names_only_flags_and_variables_that_exist() -> None:
    serve = {s.flag for s in serve_flags.SETTINGS} | {"--pin"}
    manager_help = subprocess.run([sys.executable, "-m", "workers.manager", "--help"],
                                  capture_output=True, text=True, timeout=120).stdout
    prose = README[:README.index("| variable | default | used by | meaning |")]
    for flag in set(re.findall(r"`(--[a-z][a-z0-9-]*)", prose)):
        if flag in ("--device", "--toy", "--mps", "--quick", "--out"):  # bench's, said there
            continue
        assert flag in serve or flag in manager_help, f"the README names {flag}"
    source = "\n".join(p.read_text() for p in ROOT.rglob("*.py")
                        if ".venv" not in p.parts and "tests" not in p.parts)
    source += "".join(p.read_text() for p in ROOT.glob("compose*.yaml"))
    for variable in set(re.findall(r"(SYMBIOSIS_[A-Z_]+[A-Z])", README)):
        assert variable in source, f"the README names {variable}, which nothing reads"
