"""An executor that serves only fine-tuning jobs, beside one that serves inference, runs at Linux's
idle scheduling priority (SCHED_IDLE): its compute takes only the cycles no other process wants,
so the serving executor and the inference workers keep their cores while jobs fill the gaps
(`symbiosis serve --idle-training`). Measured beside 6 decoding tenants on a 2-core host (bench
NOTES, "the jobs on a second executor at SCHED_IDLE"): training 2.5-3x what it keeps in the one
executor, at the same per-token latency; at nice 0 instead, the latency 1.6x.

Applied to every thread the process has, before torch starts its OpenMP team, whose threads
inherit it. An unprivileged process cannot leave SCHED_IDLE, so the whole process stays there.
(One thread of a shared executor at SCHED_IDLE would not do: holding the GIL, it would stall the
serving threads behind it.)"""

from __future__ import annotations

import contextlib
import logging
import os

log = logging.getLogger("executor")


def run_idle() -> bool:
    """Put every thread of this process at SCHED_IDLE; False where the host has no such policy
    (or refuses it), with a warning: the executor then runs at its usual priority."""
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
        for tid in threads:
            with contextlib.suppress(ProcessLookupError):  # a thread that has just ended
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError) as exc:
        log.warning("could not run at idle priority (SCHED_IDLE): %s", exc)
        return False
    return True
