"""A large upload is validated off the event loop: other requests are answered meanwhile; a
tenant uploads (files and adapters) a few at a time; an upload is never held in memory whole."""

from __future__ import annotations

import hashlib
import json
import threading
import time

from gateway.settings import GatewaySettings
from tests.gateway.conftest import KEY, assert_answered_all_along, health_meanwhile, serving
from tests.gateway.manager_stand_in import ManagerStandIn

ROW = json.dumps({"messages": [
    {"role": "user", "content": "Tell me something about apples and pears, please. " * 4},
    {"role": "assistant", "content": "Apples are red and pears are green, mostly. " * 4}]})


def test_health_answers_while_a_large_upload_is_validated(tmp_path) -> None:
    data = "\n".join([ROW] * 30_000).encode()  # ~14 MB: seconds of tokenizing
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                               manager=f"ipc://{tmp_path}/manager.sock")
    with serving(settings) as (client, _):
        answer, seconds, waits = health_meanwhile(client, lambda: client.post(
            "/v1/files", headers=KEY, files={"file": ("big.jsonl", data)},
            data={"purpose": "fine-tune"}), head_start_s=0.5)  # the body is in by then
    assert answer.status_code == 200, answer.text
    assert answer.json()["bytes"] == len(data)
    assert seconds > 1.5 and len(waits) >= 5  # the test saw the validation happen
    assert_answered_all_along(waits, seconds, head_start_s=0.5)


def test_a_tenants_uploads_are_capped_and_others_go_on(tmp_path) -> None:
    data = "\n".join([ROW] * 20_000).encode()  # seconds of validation each
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme,beta=sk-beta",
                               manager=f"ipc://{tmp_path}/manager.sock")
    with serving(settings) as (client, _):
        busy = client.app.state.uploads
        results: list = []

        def upload() -> None:
            results.append(client.post("/v1/files", headers=KEY, data={"purpose": "fine-tune"},
                                       files={"file": ("big.jsonl", data)}))

        threads = [threading.Thread(target=upload) for _ in range(2)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while busy._busy["acme"] < 2:
            assert time.monotonic() < deadline, "the two uploads never ran at once"
            time.sleep(0.01)
        third = client.post("/v1/files", headers=KEY, data={"purpose": "fine-tune"},
                            files={"file": ("small.jsonl", ROW.encode())})
        other = client.post("/v1/files", headers={"Authorization": "Bearer sk-beta"},
                            data={"purpose": "fine-tune"},
                            files={"file": ("small.jsonl", ROW.encode())})
        adapter = client.post("/v1/adapters", headers=KEY, data={"name": "bot"}, files={
            "adapter_config": ("adapter_config.json", b"{}"),
            "adapter_model": ("adapter_model.safetensors", b"\0" * 1024)})
        for thread in threads:
            thread.join()
        for refused in (third, adapter):  # an adapter's upload takes one of the slots too
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "too_many_concurrent_requests"
        assert other.status_code == 200, other.text
        assert [r.status_code for r in results] == [200, 200]
        assert busy._busy["acme"] == 0


def test_an_upload_is_never_held_in_the_gateways_memory_whole_either_way(tmp_path) -> None:
    """A real gateway process: its peak RSS (VmHWM) barely moves for a 48 MB upload, nor for
    reading it back."""
    import os
    import subprocess
    import sys

    import httpx

    from launcher.ports import free_port

    port, endpoint = free_port(), f"ipc://{tmp_path}/manager.sock"
    env = {**os.environ, "SYMBIOSIS_DATA_DIR": str(tmp_path / "data"), "SYMBIOSIS_PORT": str(port),
           "SYMBIOSIS_API_KEYS": "acme=sk-acme", "SYMBIOSIS_MANAGER": endpoint}
    (tmp_path / "data").mkdir()
    manager = ManagerStandIn(tmp_path / "data", endpoint)
    gateway = subprocess.Popen([sys.executable, "-m", "gateway"], env=env,
                               stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{base}/health", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and gateway.poll() is None
                time.sleep(0.2)
        small = httpx.post(f"{base}/v1/files", headers=KEY, data={"purpose": "fine-tune"},
                           files={"file": ("s.jsonl", ROW.encode())}, timeout=60)
        assert small.status_code == 200, small.text  # the tokenizer is loaded now
        before = _peak_rss(gateway.pid)
        big = tmp_path / "big.jsonl"
        big.write_bytes("\n".join([ROW] * 100_000).encode())  # ~48 MB
        with big.open("rb") as f:
            response = httpx.post(f"{base}/v1/files", headers=KEY, data={"purpose": "fine-tune"},
                                  files={"file": ("big.jsonl", f)}, timeout=600)
        assert response.status_code == 200, response.text
        assert response.json()["bytes"] == big.stat().st_size
        grown = _peak_rss(gateway.pid) - before
        assert grown < 24 * 2**20, f"peak RSS grew {grown / 2**20:.0f} MiB"
        digest = hashlib.sha256()  # and read back the same way, a chunk at a time
        with httpx.stream("GET", f"{base}/v1/files/{response.json()['id']}/content",
                          headers=KEY, timeout=600) as content:
            assert content.headers["content-length"] == str(big.stat().st_size)
            for chunk in content.iter_bytes():
                digest.update(chunk)
        assert digest.hexdigest() == hashlib.sha256(big.read_bytes()).hexdigest()
        grown = _peak_rss(gateway.pid) - before
        assert grown < 24 * 2**20, f"peak RSS grew {grown / 2**20:.0f} MiB reading it back"
    finally:
        gateway.terminate()
        gateway.wait(10)
        manager.close()


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024
