"""Whole-or-nothing writes to the data directory when several processes write one path."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from state.storage import Reserve, write_new


def test_a_write_leaves_another_writers_staging_file_alone(tmp_path: Path) -> None:
    """A staging file of another writer of the same path (processes restoring the disk
    reserve at once): this write renames its own, and that one stays."""
    target = tmp_path / ".space-reserve"
    foreign = tmp_path / ".space-reserve.tmp"
    foreign.write_bytes(b"another writer's, half written")
    assert write_new(target, b"\0" * 16) == 16
    assert target.read_bytes() == b"\0" * 16
    assert foreign.read_bytes() == b"another writer's, half written"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".space-reserve", ".space-reserve.tmp"]


def test_writers_of_one_path_at_once_each_write_it_whole(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def restore() -> None:
        start.wait()
        try:
            assert Reserve(tmp_path, size=1 << 16).restore()
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=restore) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert (tmp_path / ".space-reserve").stat().st_size == 1 << 16
    assert [p.name for p in tmp_path.iterdir()] == [".space-reserve"]  # no staging file left


def test_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    def chunks():
        yield b"half"
        raise RuntimeError("the source broke")

    with pytest.raises(RuntimeError):
        write_new(tmp_path / "file", chunks())
    assert list(tmp_path.iterdir()) == []
