"""The operator CLI: a tenant created with a tier, a quota, rate limits or latency targets is
loaded with them and its key works; an argument outside its rule is a usage error that names
the rule."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from gateway.tenants import TenantDirectory
from launcher.cli import parser
from wire.call.messages import NO_TARGETS, CallTargets
from wire.manager import NO_TOKEN_TARGETS, TokenTargets


def test_tenants_create_stores_the_tier_the_quota_and_a_working_key(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "launcher.cli", "tenants", "create", "gold",
                          "--job-priority", "40", "--max-storage-mb", "0.5",
                          "--requests-per-minute", "90", "--tokens-per-minute", "40000",
                          "--data-dir", str(tmp_path)],
                         check=True, capture_output=True, text=True).stdout
    key = re.search(r"(sk-symb-\S+)", out).group(1)
    directory = TenantDirectory.load(tmp_path / "tenants.json")
    tenant = directory.authenticate(key)
    assert tenant is not None and tenant.id == "gold" and tenant.job_priority == 40
    assert tenant.storage_quota() == 2**19
    assert (tenant.requests_per_minute, tenant.tokens_per_minute) == (90, 40_000)
    refused = subprocess.run([sys.executable, "-m", "launcher.cli", "tenants", "create", "lead",
                              "--job-priority", "500", "--data-dir", str(tmp_path)],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "job-priority" in refused.stderr
    refused = subprocess.run([sys.executable, "-m", "launcher.cli", "tenants", "create", "lead",
                              "--max-storage-mb", "-1", "--data-dir", str(tmp_path)],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "max-storage-mb" in refused.stderr


def test_tenants_create_stores_latency_targets_that_its_requests_carry(tmp_path) -> None:
    def create(name: str, *flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "launcher.cli", "tenants", "create", name,
                               *flags, "--data-dir", str(tmp_path)], capture_output=True,
                              text=True)

    made = create("swift", "--decode-target-ms", "0.5", "--prefill-target-ms", "40",
                  "--ttft-target-ms", "800", "--inter-token-target-ms", "60")
    assert made.returncode == 0, made.stderr
    create("steady")
    create("instant", "--decode-target-ms", "0.0001")
    tenants = TenantDirectory.load(tmp_path / "tenants.json").tenants
    assert tenants["swift"].call_targets() == CallTargets(decode_us=500, prefill_us=40_000)
    assert tenants["instant"].call_targets() == CallTargets(decode_us=1)  # not 0, "none asked"
    assert tenants["steady"].call_targets() == NO_TARGETS  # the executor's own
    assert tenants["swift"].token_targets() == TokenTargets(800_000, 60_000)
    assert tenants["steady"].token_targets() == NO_TOKEN_TARGETS
    for flag, value in (("--decode-target-ms", "-1"), ("--prefill-target-ms", "nan"),
                        ("--decode-target-ms", "61000"), ("--ttft-target-ms", "-2"),
                        ("--inter-token-target-ms", "inf")):
        refused = create("odd", flag, value)
        assert refused.returncode == 2 and "latency target" in refused.stderr, (flag, value)



@pytest.mark.parametrize(("argv", "says"), [
    (["tenants", "create", "Bad"], "a tenant id uses lowercase letters"),
    (["tenants", "create", "acme\n"], "a tenant id uses"),
    (["tenants", "revoke", "../acme"], "a tenant id uses"),
    (["tenants", "create", "ok", "--max-concurrent", "0"], "at least 1, not 0"),
    (["tenants", "create", "ok", "--job-priority", "1000"], "a priority is -100..100, not 1000"),
    (["tenants", "create", "ok", "--tokens-per-minute", "1.5"], "an integer at least 0, not '1.5'"),
    (["adapters", "register", "--tenant", "Bad", "--name", "x", "dir"], "a tenant id uses"),
    (["serve", "--port", "99999"], "a port is 0..65535, not 99999"),
    (["serve", "--threads", "-3"], "--threads: an integer at least 1, not -3"),
    (["serve", "--training-share", "1"], "between 0 and 1, both excluded, not 1"),
    (["serve", "--idle-s", "0"], "--idle-s: a number above 0, not 0"),
    (["serve", "--device", "gpu"], "--device: cpu or cuda[:N], not 'gpu'"),
    (["serve", "--policy", "greedy"], "one of opportunistic, eager, lockstep: not 'greedy'"),
    (["serve", "--privacy", "maybe"], "--privacy: true or false, not 'maybe'"),
])
def test_an_out_of_rule_argument_is_a_usage_error_naming_the_rule(argv, says, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        parser().parse_args(argv)
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert says in error and "Traceback" not in error and "-99, -98" not in error


def test_a_variable_outside_its_rule_is_a_usage_error_of_serve(monkeypatch, capsys) -> None:
    """A variable already set is a flag's default, held to the same rule before anything starts
    (the executor used to fail at start with a traceback)."""
    monkeypatch.setenv("SYMBIOSIS_EXECUTOR_THREADS", "-3")
    with pytest.raises(SystemExit) as stopped:
        parser().parse_args(["serve"])
    assert stopped.value.code == 2
    assert "--threads: an integer at least 1, not -3" in capsys.readouterr().err


def test_registering_for_a_tenant_no_key_reaches_says_so(tmp_path) -> None:
    from tests.e2e.adapters import save_adapter

    adapter = save_adapter(tmp_path / "adapter", "lora", 1)

    def register(tenant: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "launcher.cli", "adapters", "register",
                               "--tenant", tenant, "--name", "bot", str(adapter),
                               "--data-dir", str(tmp_path)], capture_output=True, text=True)

    subprocess.run([sys.executable, "-m", "launcher.cli", "tenants", "create", "acme",
                    "--data-dir", str(tmp_path)], check=True, capture_output=True)
    known, unknown = register("acme"), register("ghost")
    assert (known.returncode, unknown.returncode) == (0, 0)  # registered either way
    assert "registered acme/bot@1" in known.stdout and "note:" not in known.stderr
    assert "registered ghost/bot@1" in unknown.stdout
    assert "note: no tenant ghost" in unknown.stderr and "tenants create ghost" in unknown.stderr


def test_one_key_of_a_tenant_is_revoked_and_tenants_are_listed_without_keys(tmp_path) -> None:
    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "launcher.cli", "tenants", *argv,
                               "--data-dir", str(tmp_path)], capture_output=True, text=True)

    assert cli("list").stdout == f"no tenants in {tmp_path / 'tenants.json'}\n"
    first, second = (re.search(r"(sk-symb-\S+)", cli("create", "acme", "--job-priority", "40")
                               .stdout).group(1) for _ in range(2))
    cli("create", "solo")
    assert cli("list").stdout == "acme  2 keys  job_priority=40\nsolo  1 key\n"
    revoked = cli("revoke", "acme", "--key", first)
    assert revoked.returncode == 0 and "that key revoked" in revoked.stdout
    directory = TenantDirectory.load(tmp_path / "tenants.json")
    assert directory.authenticate(first) is None
    assert directory.authenticate(second).job_priority == 40
    again = cli("revoke", "acme", "--key", first)
    assert again.returncode == 1 and "has no such key" in again.stderr
    assert cli("revoke", "solo", "--key", second).returncode == 1  # another tenant's key
    assert cli("list").stdout == "acme  1 key  job_priority=40\nsolo  1 key\n"
    assert first not in cli("list").stdout + (tmp_path / "tenants.json").read_text()
