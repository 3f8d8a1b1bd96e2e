"""Host memory a busy worker frees, kept by malloc for its next allocations; given back idle.

Memory new to a process costs a page fault per 4 KiB on its first write. glibc serves an
allocation above its mmap threshold (128 KiB, raised to the size of each such block freed, up to
32 MiB) with a mapping of its own, unmapped when freed, and trims its heap's free top once it
exceeds twice that threshold. A running batch's KV cache is rewritten into new tensors whenever
rows join or leave and whenever a layer's room fills (`workers.inference.batch`), so a busy
worker kept faulting the memory it had just freed back in: on the 2-core VM of bench 15 (about
15 us a fault), a 1,024-token prompt joining 4 running rows of llama-160m faulted 94,000 pages
(its rooms, 470 MB) and took 0.5-1.8 s, against 22 ms for the same writes into memory written
before. On 2 MiB pages (as the executor's weights) it faulted 512 times less often and took as
long (1.2-1.5 s; where that time went was not traced).

`keep_freed` has malloc serve every allocation of up to MMAP_MAX from its heap and keep what is
freed there (up to KEEP at its top), so that the next cache reuses it; `give_back` returns the
heap's free memory to the system (`malloc_trim`), which a worker does once it has had no work
for IDLE_S (`Reserve`), so that an idle worker does not hold a burst's memory. A tensor larger
than MMAP_MAX (glibc's largest threshold; a layer's keys of 8 rows x 2,048 positions of
llama-160m: 50 MB) still gets a mapping of its own. Elsewhere than glibc (no `mallopt`) both do
nothing.
"""

from __future__ import annotations

import ctypes
import logging
import time

log = logging.getLogger("workers.memory")

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters
M_MMAP_THRESHOLD = -3
MMAP_MAX = 32 << 20  # the largest mmap threshold glibc takes on 64-bit systems
IDLE_S = 5.0  # a worker without work this long gives its freed memory back
KEEP = 1 << 30  # free bytes at the heap's top before malloc gives them back by itself (an int)


def _libc() -> ctypes.CDLL | None:
    libc = ctypes.CDLL(None)
    if not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc


def keep_freed() -> bool:
    """Allocations up to MMAP_MAX from malloc's heap, and what is freed kept there; False where
    malloc is not glibc's or refuses."""
    libc = _libc()
    if libc is None:
        return False
    kept = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_MAX)) and \
        bool(libc.mallopt(M_TRIM_THRESHOLD, KEEP))
    if not kept:
        log.warning("malloc refused to keep freed memory: each KV cache rewrite faults in anew")
    return kept


def give_back() -> None:
    """Return the heap's free memory to the system."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


class Reserve:
    """A worker's freed memory: kept while it works, given back once it has had no work for
    `idle_s` (a short pause between two requests keeps it)."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        keep_freed()
        self.worked: float | None = None  # when it last had work, while memory may be kept

    def note(self, busy: bool) -> None:
        """After each round of the worker's loop: whether it had work."""
        now = time.monotonic()
        if busy:
            self.worked = now
        elif self.worked is not None and now - self.worked >= self.idle_s:
            give_back()
            self.worked = None
