"""A full disk, for real: the gateway's data directory on a 4 MiB tmpfs. Writes that find no
room answer 507 `insufficient_storage` and leave no partial file or row behind; DELETE still
works (and frees the room); /ready says the disk is low; with room again, uploads work."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.settings import GatewaySettings
from tests.gateway.conftest import KEY, serving

SIZE = 4 * 2**20
LINE = json.dumps({"messages": [{"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "hello"}]}) + "\n"


@pytest.fixture()
def small_disk(tmp_path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    assert done.returncode == 0, f"this test mounts a small tmpfs (as root): {done.stderr}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path, leave: int) -> Path:
    """A filler file that leaves about `leave` bytes free."""
    filler = disk / "filler"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with filler.open("ab") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


def _files(disk: Path) -> list[str]:
    return sorted(p.name for p in (disk / "files").iterdir())


def test_a_full_disk_is_a_507_with_nothing_left_behind_and_delete_frees_it(small_disk,
                                                                           tmp_path) -> None:
    settings = GatewaySettings(data_dir=small_disk, api_keys="acme=sk-acme",
                               manager=f"ipc://{tmp_path}/manager.sock",
                               min_free_mb=1)
    with serving(settings) as (client, _):
        kept = client.post("/v1/files", headers=KEY, data={"purpose": "fine-tune"},
                           files={"file": ("a.jsonl", (LINE * 20).encode())})
        assert kept.status_code == 200, kept.text
        assert client.get("/ready").json()["checks"]["disk"] is True
        filler = _fill(small_disk, 64 * 1024)
        big = (LINE * (300 * 1024 // len(LINE))).encode()  # ~300 KB into ~64 KB of room
        before = _files(small_disk)
        response = client.post("/v1/files", headers=KEY, data={"purpose": "fine-tune"},
                               files={"file": ("b.jsonl", big)})
        assert response.status_code == 507, response.text
        error = response.json()["error"]
        assert error["code"] == "insufficient_storage" and "disk space" in error["message"]
        assert _files(small_disk) == before  # no partial file, no staging file
        assert len(client.get("/v1/files", headers=KEY).json()["data"]) == 1
        ready = client.get("/ready").json()
        assert ready["checks"]["disk"] is False and ready["disk_free_bytes"] < 2**20
        filler.write_bytes(b"")  # the operator makes room ...
        _fill(small_disk, 0)  # ... then it fills up completely: even SQLite has none
        deleted = client.delete(f"/v1/files/{kept.json()['id']}", headers=KEY)
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
        assert client.get(f"/v1/files/{kept.json()['id']}", headers=KEY).status_code == 404
        filler.unlink()
        again = client.post("/v1/files", headers=KEY, data={"purpose": "fine-tune"},
                            files={"file": ("b.jsonl", big)})
        assert again.status_code == 200, again.text
        assert client.get("/ready").json()["checks"]["disk"] is True


def test_an_adapter_registration_on_a_full_disk_is_a_507_and_stores_nothing(small_disk,
                                                                           tmp_path) -> None:
    from tests.e2e.adapters import save_adapter

    adapter = save_adapter(tmp_path / "adapter", "lora", 1)
    settings = GatewaySettings(data_dir=small_disk, api_keys="acme=sk-acme",
                               manager=f"ipc://{tmp_path}/manager.sock")
    with serving(settings) as (client, _):
        _fill(small_disk, 8 * 1024)
        files = {name: (name, (adapter / name).read_bytes()) for name in
                 ("adapter_config.json", "adapter_model.safetensors")}
        response = client.post("/v1/adapters", headers=KEY, data={"name": "bot"},
                               files={"adapter_config": files["adapter_config.json"],
                                      "adapter_model": files["adapter_model.safetensors"]})
        assert response.status_code == 507, response.text
        assert client.get("/v1/models/acme/bot", headers=KEY).status_code == 404
        leftovers = [p for p in small_disk.rglob("*") if p.is_file()
                     and p.name not in ("filler", ".space-reserve", "manager.lock", "state.db",
                                        "state.db-wal",
                                        "state.db-shm", "tenants.json")]
        assert leftovers == []
