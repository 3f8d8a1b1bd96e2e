"""Page-locking clients' shared-memory segments for an executor on a GPU.

Rows copied to the GPU from pageable memory go through a staging buffer, synchronously; from
page-locked (pinned) memory they are one asynchronous DMA, and so are results copied back, the
executor waiting once per batch before it answers. The executor pins each CPU client's segment
when it maps it (`pin`, on any thread: pinning never races a copy).

Unpinning memory a queued copy still reads is undefined, so it never happens where a copy could
be in flight: whoever lets a segment go only `retire`s it (keeping its mapping alive), and the
thread that queues the copies unpins what was retired in `settle`, right after it has waited
for its stream at the end of a batch. A registration the driver still holds at a new segment's
address, left by memory since unmapped, is replaced (copies would reach its old pages). A refused
pin is said loudly: the segment stays pageable, every copy through it synchronous (correct,
slower).
"""

from __future__ import annotations

import logging
import threading

import torch

from wire.call.device import ALREADY_REGISTERED, DeviceRefused, Driver

log = logging.getLogger("wire.call.pinning")


class HostPins:
    def __init__(self, device: torch.device, driver: Driver | None = None) -> None:
        self.index = device.index or 0
        self._driver = driver
        self._pinned: set[int] = set()
        self._retired: list[tuple[int, torch.Tensor]] = []  # (pointer, what keeps it mapped)
        self._lock = threading.Lock()

    def pin(self, memory: torch.Tensor) -> bool:
        """Page-lock a host tensor's bytes; False (said as a warning) when refused. Memory
        pinned here already (retired and not yet settled, say) stays pinned as it is."""
        pointer = memory.data_ptr()
        with self._lock:
            if pointer in self._pinned:
                self._retired = [entry for entry in self._retired if entry[0] != pointer]
                return True
        try:
            self._register(pointer, memory.numel() * memory.element_size())
        except DeviceRefused as exc:
            log.warning("shared memory NOT pinned, copies through it stay synchronous (%s)", exc)
            return False
        with self._lock:
            self._pinned.add(pointer)
        return True

    def _register(self, pointer: int, size: int) -> None:
        """Register [pointer, pointer + size). A registration the driver still holds at this
        address, not pinned here, was left by memory since unmapped (a mapping lives at one
        address; memory retired here keeps its mapping until settled): copies would reach its
        old pages, so it is replaced. One that starts elsewhere cannot be: refused."""
        lib = self._lib()
        try:
            lib.register_host(pointer, size, self.index)
        except DeviceRefused as exc:
            if exc.status != ALREADY_REGISTERED:
                raise
            try:
                lib.unregister_host(pointer, self.index)
            except DeviceRefused as stale:
                raise DeviceRefused(f"{exc}; a stale registration overlaps it and stays: "
                                    f"{stale}", exc.status) from None
            log.warning("a stale registration at %#x replaced (%s)", pointer, exc)
            lib.register_host(pointer, size, self.index)

    def retire(self, memory: torch.Tensor) -> None:
        """Unpin at the next `settle`; the tensor keeps the mapping alive until then."""
        with self._lock:
            if memory.data_ptr() in self._pinned:
                self._retired.append((memory.data_ptr(), memory))

    def settle(self) -> int:
        """Unpin what was retired. Call only from the thread that queues copies, after it has
        waited for them. Returns how many were unpinned."""
        with self._lock:
            retired, self._retired = self._retired, []
            for pointer, _ in retired:
                self._pinned.discard(pointer)
        for pointer, _ in retired:
            try:
                self._lib().unregister_host(pointer, self.index)
            except DeviceRefused as exc:
                log.warning("shared memory at %#x not unpinned (%s)", pointer, exc)
        return len(retired)

    @property
    def pinned(self) -> int:
        return len(self._pinned)

    @property
    def retiring(self) -> int:
        return len(self._retired)

    def _lib(self) -> Driver:
        if self._driver is None:
            self._driver = Driver()
        return self._driver
