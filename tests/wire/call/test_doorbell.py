"""Doorbell pipes between a worker and the executor, in one process (no executor needed)."""

from __future__ import annotations

import os

import pytest

from wire.call import doorbell as bell

UID = os.geteuid()


@pytest.fixture()
def pair(tmp_path):
    worker = bell.WorkerDoorbell(tmp_path / f"{bell.NAME_PREFIX}1")
    executor = bell.ExecutorDoorbell(str(tmp_path / f"{bell.NAME_PREFIX}1"), tmp_path, UID)
    yield worker, executor
    worker.close()
    executor.close()


def test_ring_and_answer_once_per_call(pair) -> None:
    worker, executor = pair
    assert not executor.rang()  # no writer yet: still connecting, not a hang-up
    worker.open()
    assert not executor.rang()
    worker.ring()
    assert executor.rang() and not executor.rang()
    assert not worker.wait(0.01)
    executor.answer()
    assert worker.wait(1.0) and not worker.wait(0.01)


def test_paths_are_gone_once_both_ends_are_open(pair, tmp_path) -> None:
    worker, _ = pair
    assert worker.request_path.exists() and worker.reply_path.exists()
    worker.open()
    assert list(tmp_path.iterdir()) == []


def test_each_side_sees_the_other_leave(tmp_path) -> None:
    worker = bell.WorkerDoorbell(tmp_path / f"{bell.NAME_PREFIX}a")
    executor = bell.ExecutorDoorbell(str(tmp_path / f"{bell.NAME_PREFIX}a"), tmp_path, UID)
    worker.open()
    worker.close()
    with pytest.raises(bell.Hangup):
        executor.rang()
    executor.close()
    worker = bell.WorkerDoorbell(tmp_path / f"{bell.NAME_PREFIX}b")
    executor = bell.ExecutorDoorbell(str(tmp_path / f"{bell.NAME_PREFIX}b"), tmp_path, UID)
    worker.open()
    executor.close()
    with pytest.raises(bell.Hangup):
        worker.wait(1.0)
    with pytest.raises(bell.Hangup):
        worker.ring()
    worker.close()


def test_the_executor_opens_only_named_pipes_where_it_expects_them(tmp_path) -> None:
    victim = tmp_path / "precious"
    victim.write_bytes(b"precious")
    os.mkfifo(tmp_path / f"{bell.NAME_PREFIX}x.req")
    reply = tmp_path / f"{bell.NAME_PREFIX}x.rep"
    reply.write_bytes(b"precious")  # a regular file where the reply pipe should be
    with pytest.raises(OSError, match="not a named pipe"):
        bell.ExecutorDoorbell(str(tmp_path / f"{bell.NAME_PREFIX}x"), tmp_path, UID)
    reply.unlink()
    reply.symlink_to(victim)  # a link to someone's file
    with pytest.raises(OSError):
        bell.ExecutorDoorbell(str(tmp_path / f"{bell.NAME_PREFIX}x"), tmp_path, UID)
    assert victim.read_bytes() == b"precious"
    elsewhere = bell.WorkerDoorbell(tmp_path / "other-name")
    with pytest.raises(OSError, match="is not a"):
        bell.ExecutorDoorbell(str(tmp_path / "other-name"), tmp_path, UID)
    with pytest.raises(OSError, match="is not a"):
        bell.ExecutorDoorbell(str(tmp_path / f"{bell.NAME_PREFIX}1"), tmp_path / "sub", UID)
    elsewhere.close()
    mine = bell.WorkerDoorbell(tmp_path / f"{bell.NAME_PREFIX}y")
    with pytest.raises(OSError, match="of uid"):  # pipes of another user
        bell.ExecutorDoorbell(str(mine.prefix), tmp_path, UID + 1)
    mine.close()
