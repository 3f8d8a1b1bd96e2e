"""What the idle twin tells the serving executor of fine-tuning's work (`executor.twin`), through
a page the two share, mapped before the fork: how many training calls it has queued or running,
and the seconds of compute it had the host for so far (of each batch's seconds, its CPU time over
its threads: at nice 19, the tenants' compute stretches its batches, and their wall time would
count as training's what the others took). The serving executor reads them, counts the twin's
seconds as training's in its `TrainingShare` and, while the twin has work and training less than
its floor, leaves its inference batches a moment (`Scheduler`): the tenants, waiting for it,
leave the host to the twin, and `--training-share` holds across both executors as it does on
the one. The other way, the serving executor tells until when the twin's training should leave
the host to inference (each inference batch holds it a moment, unless training is owed its
floor): nice 19 leaves the tenants the cores, not the memory bandwidth and caches a twin's
batch takes beside theirs."""

from __future__ import annotations

import ctypes
import mmap


class TwinLedger:
    def __init__(self) -> None:
        self._page = mmap.mmap(-1, mmap.PAGESIZE)  # anonymous and shared: both sides of a fork
        self._calls = ctypes.c_int64.from_buffer(self._page, 0)  # aligned: one store, one load
        self._seconds = ctypes.c_double.from_buffer(self._page, 8)
        self._hold = ctypes.c_double.from_buffer(self._page, 16)  # time.monotonic(): system-wide

    # -- the twin's side ------------------------------------------------------------------------

    def working(self, calls: int) -> None:
        """Training calls queued or running on the twin now."""
        self._calls.value = calls

    def computed(self, seconds: float) -> None:
        self._seconds.value += seconds

    @property
    def held_until(self) -> float:
        return self._hold.value

    # -- the serving executor's side ------------------------------------------------------------

    def hold(self, until: float) -> None:
        """The twin's training leaves the host to inference until `until` (monotonic)."""
        self._hold.value = until

    @property
    def calls(self) -> int:
        return self._calls.value

    @property
    def seconds(self) -> float:
        return self._seconds.value
