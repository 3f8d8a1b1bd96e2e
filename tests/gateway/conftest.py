"""The gateway in-process (TestClient), with no worker manager behind it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.settings import GatewaySettings

KEY = {"Authorization": "Bearer sk-acme"}


@pytest.fixture()
def client(tmp_path) -> Iterator[TestClient]:
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme,beta=sk-beta",
                               manager="ipc:///tmp/symbiosis-test-no-manager.sock",
                               max_body_bytes=64 * 1024)
    with TestClient(create_app(settings)) as c:
        yield c
