"""A child forked from a loaded parent that shares its memory: the preloaded spawner's workers and
trainers (`workers.spawner`), the executor's idle twin (`executor.twin`).

Every object the parent holds goes to the collector's permanent generation first: a child's
collections then never write to those objects' headers, so their pages stay shared (without it
a worker's private memory grew ~4x after its first full collection). The child gets SIGTERM when
the parent dies, and never runs the parent's exit handlers."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
from collections.abc import Callable

log = logging.getLogger("wire.forking")
PR_SET_PDEATHSIG = 1


def fork_child(run: Callable[[], int], name: str) -> int:
    """Fork a child that runs `run()` and exits with its code (1 if it raised, logged as
    `name`'s crash); returns the child's pid."""
    parent = os.getpid()
    gc.freeze()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() == parent:  # else the parent died before the line above
            code = run()
    except BaseException:
        log.exception("%s crashed", name)
    finally:
        os._exit(code)  # never the parent's exit handlers in its fork
