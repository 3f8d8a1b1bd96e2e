"""A large upload is validated off the event loop: other requests are answered meanwhile."""

from __future__ import annotations

import json
import threading
import time

from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.gateway.conftest import KEY

ROW = json.dumps({"messages": [
    {"role": "user", "content": "Tell me something about apples and pears, please. " * 4},
    {"role": "assistant", "content": "Apples are red and pears are green, mostly. " * 4}]})


def test_health_answers_while_a_large_upload_is_validated(tmp_path) -> None:
    data = "\n".join([ROW] * 30_000).encode()  # ~14 MB: seconds of tokenizing
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                               manager="ipc:///tmp/symbiosis-test-no-manager.sock")
    with TestClient(create_app(settings)) as client:
        result: dict = {}

        def upload() -> None:
            started = time.monotonic()
            result["response"] = client.post("/v1/files", headers=KEY,
                                              files={"file": ("big.jsonl", data)},
                                              data={"purpose": "fine-tune"})
            result["seconds"] = time.monotonic() - started

        uploading = threading.Thread(target=upload)
        uploading.start()
        time.sleep(0.5)  # the body is in; validation has begun
        waits = []
        while uploading.is_alive():
            started = time.monotonic()
            assert client.get("/health").status_code == 200
            waits.append(time.monotonic() - started)
            time.sleep(0.05)
        uploading.join()
    assert result["response"].status_code == 200, result["response"].text
    assert result["response"].json()["bytes"] == len(data)
    assert result["seconds"] > 1.5 and len(waits) >= 5  # the test saw the validation happen
    assert max(waits) < result["seconds"] / 3, (max(waits), result["seconds"])
