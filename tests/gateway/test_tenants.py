"""The tenants file: a tenant's id and latency targets are checked when the file is read."""

from __future__ import annotations

import json

import pytest

from gateway.tenants import Tenant, TenantDirectory, create_tenant, hash_key


@pytest.mark.parametrize("entry", [{"decode_target_ms": -0.5}, {"prefill_target_ms": "50"},
                                   {"decode_target_ms": True}, {"prefill_target_ms": 1e9},
                                   {"ttft_target_ms": -1}, {"inter_token_target_ms": "5"},
                                   {"inter_token_target_ms": 60_001}])
def test_a_tenants_file_with_a_target_out_of_range_is_refused(tmp_path, entry) -> None:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": [{"id": "odd", **entry}]}))
    with pytest.raises(ValueError, match=r"target_ms is 0\.\.60000"):
        TenantDirectory.load(path)


@pytest.mark.parametrize("tenant_id", ["acme\n", "Acme", "../acme", "", "a" * 64])
def test_a_tenant_id_outside_the_rule_is_refused_in_the_file_and_by_the_cli(tmp_path,
                                                                          tenant_id) -> None:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": [{"id": tenant_id}]}))
    with pytest.raises(ValueError, match="invalid tenant id"):
        TenantDirectory.load(path)
    with pytest.raises(ValueError, match="invalid tenant id"):
        create_tenant(tmp_path / "new.json", tenant_id)
    assert not (tmp_path / "new.json").exists()


def test_a_storage_quota_is_the_servers_unless_the_file_sets_one(tmp_path) -> None:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": [{"id": "acme", "max_storage_mb": 1.5},
                                            {"id": "beta", "max_storage_mb": 0}]}))
    tenants = TenantDirectory.load(path, "gamma=sk-g", max_storage_mb=2).tenants
    assert {t: tenants[t].storage_quota() for t in tenants} == \
        {"acme": 3 * 2**19, "beta": 0, "gamma": 2 * 2**20}
    for bad in (-1, "10", True):
        path.write_text(json.dumps({"tenants": [{"id": "acme", "max_storage_mb": bad}]}))
        with pytest.raises(ValueError, match="max_storage_mb is a number >= 0"):
            TenantDirectory.load(path)


def test_a_key_finds_its_tenant_among_many_and_a_near_miss_finds_none() -> None:
    """Each of 20,000 tenants' keys (one with two) is its own tenant's; a key one character off
    one of them, an empty key and a key's hash given as the key are nobody's."""
    keys = {f"t{k}": f"sk-{k:05d}" for k in range(20_000)}
    tenants = [Tenant(id=tenant, key_sha256=[hash_key(key)]) for tenant, key in keys.items()]
    tenants[7].key_sha256.append(hash_key("sk-second"))
    directory = TenantDirectory(tenants)
    for tenant in ("t0", "t7", "t12345", "t19999"):
        assert directory.authenticate(keys[tenant]).id == tenant
    assert directory.authenticate("sk-second").id == "t7"
    for stranger in ("sk-00001x", "sk-0000", "", hash_key("sk-00001")):
        assert directory.authenticate(stranger) is None
