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

`keep_freed` has malloc serve every allocation of up to 32 MiB from its heap and keep what is
freed there (up to KEEP at its top), so that the next cache reuses it; a worker's `Reserve`
returns the heap's free memory to the system (`malloc_trim`) once the worker has had no work for
IDLE_S, so that an idle worker does not hold a burst's memory. A tensor larger than 32 MiB
(glibc's largest threshold; a layer's keys of 8 rows x 2,048 positions of
llama-160m: 50 MB) still gets a mapping of its own. Elsewhere than glibc both do nothing.
Trainers choose the other way (`workers.training.allocator`): a step's activations are many and
large: kept, they held twice the resident memory (a llama-1b step, 3.5 against 1.6 GB) to save
~4 % of a step.
"""

from __future__ import annotations

import logging
import time

from workers.malloc import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, MMAP_THRESHOLD_MAX, mallopt, trim

log = logging.getLogger("workers.memory")

IDLE_S = 5.0  # a worker without work this long gives its freed memory back
KEEP = 1 << 30  # free bytes at the heap's top before malloc gives them back by itself (an int)


def keep_freed() -> bool:
    """Allocations up to 32 MiB from malloc's heap, and what is freed kept there; False where
    malloc is not glibc's or refuses."""
    kept = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) and mallopt(M_TRIM_THRESHOLD, KEEP)
    if not kept:
        log.warning("malloc keeps no freed memory: each KV cache rewrite faults in anew")
    return kept


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
            trim()
            self.worked = None
