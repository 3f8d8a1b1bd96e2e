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
