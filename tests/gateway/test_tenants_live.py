"""Tenants while serving: created, changed and revoked with the `symbiosis` command against a
running gateway's data directory, each effective within a second (the key works, the new limit
holds, the revoked key is refused) with no restart; a file caught half-edited changes nothing."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable

from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.settings import GatewaySettings


def _symbiosis(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _within_a_second(check: Callable[[], bool]) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < 1.0, "not effective within a second"
        time.sleep(0.02)
    return time.monotonic() - started


def test_tenants_created_changed_and_revoked_while_serving(tmp_path) -> None:
    settings = GatewaySettings(data_dir=tmp_path,
                               manager="ipc:///tmp/symbiosis-test-no-manager.sock")
    with TestClient(create_app(settings)) as client:
        def status(key: str) -> int:
            return client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}) \
                .status_code

        assert status("sk-nobody") == 401
        out = _symbiosis("tenants", "create", "acme", "--data-dir", str(tmp_path))
        key = re.search(r"(sk-symb-\S+)", out).group(1)
        _within_a_second(lambda: status(key) == 200)
        _symbiosis("tenants", "create", "acme", "--max-concurrent", "3",
                   "--data-dir", str(tmp_path))
        _within_a_second(lambda: status(key) == 200 and
                         client.app.state.tenants.tenants["acme"].max_concurrent == 3)
        assert status(key) == 200  # the first key still works beside the second
        settings.tenants_path.write_text('{"tenants": [')  # someone mid-edit by hand
        time.sleep(0.3)
        assert status(key) == 200  # nothing changed
        settings.tenants_path.unlink()
        _symbiosis("tenants", "create", "acme", "--data-dir", str(tmp_path))
        _symbiosis("tenants", "revoke", "acme", "--data-dir", str(tmp_path))
        _within_a_second(lambda: status(key) == 401)
        error = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).json()
        assert error["error"]["code"] == "invalid_api_key"
