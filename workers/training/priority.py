"""A trainer's own compute (attention, backward, optimizer) yields to inference on a shared
host: trainers run as batch work at a lower priority (SCHED_BATCH, nice +10), so the kernel
gives a core to an inference worker that wakes up rather than to the trainer, while training
still takes every cycle nobody else wants. Called before torch starts its threads (they
inherit it)."""

from __future__ import annotations

import contextlib
import logging
import os

log = logging.getLogger("workers.training")
TRAINER_NICE = 10


def yield_to_inference() -> None:
    with contextlib.suppress(OSError, AttributeError):  # Linux only; elsewhere nice alone
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    try:
        os.nice(max(0, TRAINER_NICE - os.nice(0)))
    except OSError as exc:
        log.warning("could not lower the trainer's priority: %s", exc)
