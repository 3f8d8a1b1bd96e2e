"""The gateway in-process (TestClient): with no worker manager behind it (`client`), or with
the manager's job queue behind it (`managed`)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.gateway.manager_stand_in import ManagerStandIn

KEY = {"Authorization": "Bearer sk-acme"}


@pytest.fixture()
def client(tmp_path) -> Iterator[TestClient]:
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme,beta=sk-beta",
                               manager="ipc:///tmp/symbiosis-test-no-manager.sock",
                               max_body_bytes=64 * 1024)
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture()
def managed(tmp_path) -> Iterator[tuple[TestClient, ManagerStandIn]]:
    """The gateway with the manager's job queue behind it (`ManagerStandIn`): one job slot."""
    endpoint = f"ipc://{tmp_path}/manager.sock"
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme,beta=sk-beta",
                               manager=endpoint, max_body_bytes=64 * 1024)
    with TestClient(create_app(settings)) as c:
        manager = ManagerStandIn(tmp_path, endpoint)
        try:
            wait_until_up(c)
            yield c, manager
        finally:
            manager.close()


def wait_until_up(client: TestClient, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not client.app.state.manager.up:
        assert time.monotonic() < deadline, "the gateway never heard the manager"
        time.sleep(0.02)
