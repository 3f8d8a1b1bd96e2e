"""The operator CLI: a tenant created with a tier is loaded with it and its key works."""

from __future__ import annotations

import re
import subprocess
import sys

from gateway.tenants import TenantDirectory


def test_tenants_create_stores_the_tier_and_a_working_key(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "launcher.cli", "tenants", "create", "gold",
                          "--job-priority", "40", "--data-dir", str(tmp_path)],
                         check=True, capture_output=True, text=True).stdout
    key = re.search(r"(sk-symb-\S+)", out).group(1)
    directory = TenantDirectory.load(tmp_path / "tenants.json")
    tenant = directory.authenticate(key)
    assert tenant is not None and tenant.id == "gold" and tenant.job_priority == 40
    refused = subprocess.run([sys.executable, "-m", "launcher.cli", "tenants", "create", "lead",
                              "--job-priority", "500", "--data-dir", str(tmp_path)],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "job-priority" in refused.stderr
