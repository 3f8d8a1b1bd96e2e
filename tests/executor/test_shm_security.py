"""A client can make the executor map only its own shared-memory segment: never a path, a link
or somebody else's file (issue 18, item 1: a hello naming the state database used to get a
matmul result written into it)."""

from __future__ import annotations

import os
import secrets
import sqlite3
from pathlib import Path

import pytest
import torch

from tests.executor.test_server import RawClient, layer_index
from wire.call import messages as P
from wire.call.shm import SHM_DIR, TOKEN_BYTES, SegmentRefused, ShmBuffer


def segment_name() -> str:
    return f"symbiosis-{os.getpid()}-{secrets.token_hex(6)}"


@pytest.fixture()
def victim(tmp_path: Path) -> Path:
    """A SQLite database: its first 16 bytes ("SQLite format 3\\0") are public knowledge."""
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.execute("INSERT INTO t VALUES (42)")
    os.chmod(path, 0o600)
    return path


def attack(endpoint: str, name: str, victim: Path) -> tuple[P.Welcome, object]:
    """Hello naming `name` as shared memory with the victim's first bytes as the token, then a
    call asking for its result at offset 0 of that memory."""
    size = victim.stat().st_size
    token = victim.read_bytes()[:TOKEN_BYTES]
    client = RawClient(endpoint, hello=False)
    try:
        client.send(P.encode(P.Hello("attacker", os.getpid(), shm_name=name, shm_size=size,
                                     shm_token=token)))
        welcome, _ = client.recv()
        client.welcome = (welcome, [])
        q = layer_index(client, "model.layers.0.self_attn.q_proj")
        header = P.Call(1, P.Op.FORWARD, q, P.CallKind.INFERENCE, "float32", (1, 64), 0, 0)
        client.send(P.encode(header))
        reply, _ = client.recv()
        return welcome, reply
    finally:
        client.close()


def test_a_hello_naming_a_file_outside_the_shm_directory_is_refused(executor_for, victim):
    before = victim.read_bytes()
    welcome, reply = attack(executor_for("tiny-llama").endpoint, str(victim), victim)
    assert welcome.shm is False and welcome.doorbell is False
    assert isinstance(reply, P.Error) and reply.code == P.ErrorCode.BAD_TENSOR
    assert victim.read_bytes() == before
    with sqlite3.connect(victim) as conn:
        assert conn.execute("SELECT x FROM t").fetchall() == [(42,)]


def test_a_hello_naming_a_symlink_in_the_shm_directory_is_refused(executor_for, victim):
    before = victim.read_bytes()
    link = SHM_DIR / segment_name()
    link.symlink_to(victim)
    try:
        welcome, reply = attack(executor_for("tiny-llama").endpoint, link.name, victim)
    finally:
        link.unlink()
    assert welcome.shm is False
    assert isinstance(reply, P.Error)
    assert victim.read_bytes() == before


@pytest.mark.parametrize("name", ["../etc/passwd", "/etc/passwd", "state.db", "symbiosis-1-x",
                                  "symbiosis-1-0123456789ab/..", ""])
def test_only_segment_names_are_accepted(name: str) -> None:
    with pytest.raises(SegmentRefused):
        ShmBuffer.attach(name, 4096, os.geteuid())


def test_links_foreign_owners_and_open_modes_are_refused(tmp_path: Path) -> None:
    def plain_segment(mode: int = 0o600) -> Path:
        path = tmp_path / segment_name()
        path.write_bytes(bytes(4096))
        os.chmod(path, mode)
        return path

    target = plain_segment()
    link = tmp_path / segment_name()
    link.symlink_to(target)
    with pytest.raises(SegmentRefused, match="symbolic link"):
        ShmBuffer.attach(link.name, 4096, os.geteuid(), tmp_path)
    hard = tmp_path / segment_name()
    os.link(target, hard)
    with pytest.raises(SegmentRefused, match="links"):
        ShmBuffer.attach(hard.name, 4096, os.geteuid(), tmp_path)
    with pytest.raises(SegmentRefused, match="owned by"):
        ShmBuffer.attach(plain_segment().name, 4096, os.geteuid() + 1, tmp_path)
    with pytest.raises(SegmentRefused, match="by others"):
        ShmBuffer.attach(plain_segment(0o660).name, 4096, os.geteuid(), tmp_path)
    with pytest.raises(SegmentRefused, match="smaller"):
        ShmBuffer.attach(plain_segment().name, 8192, os.geteuid(), tmp_path)
    directory = tmp_path / segment_name()
    directory.mkdir(mode=0o700)
    with pytest.raises((SegmentRefused, IsADirectoryError)):
        ShmBuffer.attach(directory.name, 4096, os.geteuid(), tmp_path)


def test_a_real_segment_is_mapped_and_shared(tmp_path: Path) -> None:
    mine = ShmBuffer.create(4096, tmp_path)
    token = mine.write_token()
    theirs = ShmBuffer.attach(mine.name, 4096, os.geteuid(), tmp_path)
    assert theirs.read_token() == token
    theirs.view(64, torch.float32, (4,)).copy_(torch.arange(4.0))
    assert torch.equal(mine.view(64, torch.float32, (4,)), torch.arange(4.0))
    mine.unlink()
    assert not (tmp_path / mine.name).exists()
