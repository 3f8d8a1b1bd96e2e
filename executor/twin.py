"""The jobs' own executor as a forked twin of the serving one (`--idle-twin ENDPOINT`, what
`symbiosis serve` starts on a CPU): forked once the weights are loaded, it serves the
fine-tuning jobs at the lowest priority (`executor.priority`) from the same physical pages, which
neither process ever writes, so the base model is held once, not twice.

It forks before torch starts its OpenMP team (the weights are loaded on one thread; a child of a
process whose team has started may hang in its first parallel region) and never after CUDA is
initialized (`--device cpu` only: a GPU's own scheduling, not the kernel's, decides there). The
two share their fate: the twin gets SIGTERM when the serving executor dies, and the serving
executor stops, non-zero, when the twin dies, so the launcher's supervisor starts both again
(as a sharded group does, `executor.group`); the twin is asked to stop, and waited for, when
the serving executor stops."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable

from wire.forking import fork_child
from wire.stopping import StopSignal

log = logging.getLogger("executor")
STOP_S = 20.0  # the twin's own stop: its calls in flight, its server's threads


def fork_twin(serve_twin: Callable[[], int]) -> int:
    """Fork the twin, which runs `serve_twin()` at the lowest priority and exits with its code
    (`wire.forking`: it shares the serving executor's memory and dies with it)."""
    def twin() -> int:
        from executor.priority import lowest_priority

        os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the serving executor, which stops it
        lowest_priority()
        return serve_twin()

    return fork_child(twin, "the idle twin")


class Twin:
    """The serving executor's side: a thread that waits for the twin and stops the serving
    executor (`stop`) when the twin goes first."""

    def __init__(self, pid: int, stop: StopSignal) -> None:
        self.pid = pid
        self.lost: int | None = None  # the twin's exit code, had it gone first
        self._stop = stop
        self._waiter = threading.Thread(target=self._wait, name="idle-twin", daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        _, status = os.waitpid(self.pid, 0)
        if not self._stop.is_set():
            self.lost = os.waitstatus_to_exitcode(status)
            log.error("the idle twin exited (code %d): stopping, for the supervisor to start "
                      "both again", self.lost)
            self._stop.set()

    def stop(self) -> None:
        """Ask the twin to stop and wait for it (SIGKILL past STOP_S)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        self._waiter.join(STOP_S)
        if self._waiter.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self._waiter.join()
