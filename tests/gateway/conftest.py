"""The gateway in-process (TestClient), with the manager's records and job queue behind it
(`ManagerStandIn`; `client`, or `managed` with the stand-in), or with no manager (`unmanaged`)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.gateway.manager_stand_in import ManagerStandIn

KEY = {"Authorization": "Bearer sk-acme"}


@pytest.fixture()
def unmanaged(tmp_path) -> Iterator[TestClient]:
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme,beta=sk-beta",
                               manager="ipc:///tmp/symbiosis-test-no-manager.sock",
                               max_body_bytes=64 * 1024)
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture()
def managed(tmp_path) -> Iterator[tuple[TestClient, ManagerStandIn]]:
    """The gateway with the manager's records and job queue behind it: one job slot."""
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme,beta=sk-beta",
                               manager=f"ipc://{tmp_path}/manager.sock",
                               max_body_bytes=64 * 1024)
    with serving(settings) as served:
        yield served


@contextlib.contextmanager
def serving(settings: GatewaySettings) -> Iterator[tuple[TestClient, ManagerStandIn]]:
    """A gateway of these settings, with the stand-in manager on its manager endpoint."""
    manager = ManagerStandIn(settings.data_dir, settings.manager)  # bound first: up at once
    try:
        with TestClient(create_app(settings)) as c:
            wait_until_up(c)
            yield c, manager
    finally:
        manager.close()


@pytest.fixture()
def client(managed) -> TestClient:
    return managed[0]


def wait_until_up(client: TestClient, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not client.app.state.manager.up:
        assert time.monotonic() < deadline, "the gateway never heard the manager"
        time.sleep(0.02)


def health_meanwhile(client: TestClient, ask: Callable[[], Any], head_start_s: float = 0.0
                     ) -> tuple[Any, float, list[float]]:
    """`ask()` run by a thread of its own while /health is asked again and again (from
    `head_start_s` on): its answer, its seconds and each /health's wait."""
    result: dict = {}

    def asking() -> None:
        started = time.monotonic()
        result["answer"] = ask()
        result["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=asking)
    thread.start()
    time.sleep(head_start_s)
    waits = []
    while thread.is_alive():
        started = time.monotonic()
        assert client.get("/health").status_code == 200
        waits.append(time.monotonic() - started)
        time.sleep(0.02)
    thread.join()
    return result["answer"], result["seconds"], waits


def assert_answered_all_along(waits: list[float], seconds: float,
                              head_start_s: float = 0.0) -> None:
    """/health was answered all through the slow request (from `head_start_s` on), once every
    0.2 s on average (~60 answers in 1.6 s here; work done on the event loop instead leaves 1 in
    the whole request), as a loaded host's single stall of a second (seen in CI) still allows."""
    assert len(waits) >= (seconds - head_start_s) / 0.2, (len(waits), seconds)
