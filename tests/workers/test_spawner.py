"""The preloaded parent: what its forked children share with it."""

from __future__ import annotations

import gc
import os
import sys

import pytest

from workers.spawner import spawn


def private_kib() -> int:
    """This process's private memory (pages it alone holds), from the kernel's accounting."""
    fields = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name.startswith("Private_"):
                fields[name] = int(value.split()[0])
    return sum(fields.values())


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_child_collection_leaves_the_parents_objects_shared(tmp_path) -> None:
    objects = [{"i": i, "s": str(i)} for i in range(300_000)]  # ~100 MB of tracked objects
    report = tmp_path / "growth"

    def child(_preloaded) -> int:
        before = private_kib()
        gc.collect()
        report.write_text(str(private_kib() - before))
        return 0

    try:
        pid = spawn(child, None)
        _, status = os.waitpid(pid, 0)
    finally:
        gc.unfreeze()
    assert os.waitstatus_to_exitcode(status) == 0
    growth_mib = int(report.read_text()) / 1024
    assert len(objects) == 300_000
    assert growth_mib < 8, f"a full collection made {growth_mib:.1f} MiB private"


def test_stopping_waits_for_children_that_finish_and_kills_the_ones_that_do_not() -> None:
    """A trainer gets time to save its checkpoint on SIGTERM; one that never ends is killed."""
    import signal
    import time

    from workers.spawner import stop

    ready_read, ready_write = os.pipe()

    def finishing(_preloaded) -> int:  # as a trainer does: the step, then out
        signal.signal(signal.SIGTERM, lambda *_: None)
        os.write(ready_write, b"f")
        time.sleep(0.5)
        return 75

    def stubborn(_preloaded) -> int:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(ready_write, b"s")
        time.sleep(60)
        return 0

    try:
        children = {spawn(finishing, None): "trainer", spawn(stubborn, None): "worker"}
    finally:
        gc.unfreeze()
    assert sorted(os.read(ready_read, 1) + os.read(ready_read, 1)) == sorted(b"fs")
    started = time.monotonic()
    stop(dict(children), grace_s=2.0)
    assert 1.9 < time.monotonic() - started < 4  # waited out the grace for the stubborn one
    for pid in children:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped: the finishing one, and the killed one
