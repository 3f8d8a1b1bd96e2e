"""The tenants file: a tenant's latency targets are checked when the file is read."""

from __future__ import annotations

import json

import pytest

from gateway.tenants import TenantDirectory


@pytest.mark.parametrize("entry", [{"decode_target_ms": -0.5}, {"prefill_target_ms": "50"},
                                   {"decode_target_ms": True}, {"prefill_target_ms": 1e9},
                                   {"ttft_target_ms": -1}, {"inter_token_target_ms": "5"},
                                   {"inter_token_target_ms": 60_001}])
def test_a_tenants_file_with_a_target_out_of_range_is_refused(tmp_path, entry) -> None:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": [{"id": "odd", **entry}]}))
    with pytest.raises(ValueError, match=r"target_ms is 0\.\.60000"):
        TenantDirectory.load(path)
