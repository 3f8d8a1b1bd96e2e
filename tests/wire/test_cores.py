"""The cores a process may compute on: its CPU set, or fewer under a container's CPU quota."""

from __future__ import annotations

import os

from wire.cores import host_cores, quota_cores, within_quota


def test_the_cores_are_the_cpu_set_or_fewer_under_a_containers_quota(tmp_path) -> None:
    cpu_max = tmp_path / "cpu.max"
    for text, cores in (("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000\n", 1),
                        ("max 100000\n", None), ("", None)):
        cpu_max.write_text(text)
        assert quota_cores(cpu_max) == cores, text
    assert quota_cores(tmp_path / "absent") is None  # cgroup v1, or not Linux
    own = len(os.sched_getaffinity(0))
    assert host_cores(tmp_path / "absent") == own
    cpu_max.write_text("100000 100000\n")
    assert host_cores(cpu_max) == 1
    assert within_quota(8, cpu_max) == 1 and within_quota(8, tmp_path / "absent") == 8
    cpu_max.write_text(f"{100000 * (own + 4)} 100000\n")  # a quota above the CPU set
    assert host_cores(cpu_max) == own
