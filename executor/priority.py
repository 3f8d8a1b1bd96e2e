"""An executor that serves only fine-tuning jobs, beside one that serves inference, runs at the
lowest priority a process can take for itself, batch work at nice 19 (SCHED_BATCH: no wake-up
preemption of others): its compute takes the cycles the serving executor and the inference
workers leave, and a sliver more (`--idle`; the serving executor's idle twin, `executor.twin`,
which `symbiosis serve` starts on a CPU).

Measured beside 6 decoding tenants on a 2-core host (bench 6e, NOTES): SCHED_IDLE instead kept
less training at the same latency (~0.25x of the jobs alone against ~0.32x at nice 19; SCHED_IDLE
gives a thread no share at all while anything else runs), nice 10 as much training at 1.34x the
tenants' latency, a second executor at nice 0 1.6x. Where the tenants' own compute keeps every
core busy, nice 19 alone leaves training a sliver; training's floor then has the serving executor
leave the host to the twin (`executor.twin_ledger`).

Applied to every thread the process has, before torch starts its OpenMP team, whose threads
inherit it. An unprivileged process cannot raise its priority again, so it stays there. (One
thread of a shared executor at a low priority would not do: holding the GIL, it would stall the
serving threads behind it.)"""

from __future__ import annotations

import contextlib
import logging
import os

log = logging.getLogger("executor")
NICE = 19


def lowest_priority() -> bool:
    """Put every thread of this process at SCHED_BATCH, nice 19; False where the host refuses
    (not Linux), with a warning: the executor then runs at its usual priority."""
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
        for tid in threads:
            with contextlib.suppress(ProcessLookupError):  # a thread that has just ended
                os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, tid, NICE)
    except (OSError, AttributeError) as exc:
        log.warning("could not run at the lowest priority (SCHED_BATCH, nice 19): %s", exc)
        return False
    return True
