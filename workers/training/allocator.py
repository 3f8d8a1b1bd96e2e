"""A trainer gives freed activations back to the system at once.

A training step allocates and frees tensors of megabytes in an order no allocator can foresee.
glibc's malloc serves such a tensor from its heap once its dynamic mmap threshold has risen past
its size (it rises up to 32 MiB, following the largest block freed), and freed pages in the
middle of the heap stay resident: a remote llama-1b LoRA step of 2 x 256 tokens reached 3.5 GB
resident against ~1.6 GB with the threshold held at 4 MiB (tensors at least that large get pages
of their own, unmapped when freed), for ~4% more time a step (page faults on fresh pages). Below
4 MiB the heap keeps serving: the many small tensors would cost more in faults than they hold.
"""

from __future__ import annotations

import logging

from workers.malloc import M_MMAP_THRESHOLD, mallopt

log = logging.getLogger("workers.training")
LARGE_TENSOR_BYTES = 4 * 2**20


def give_back_large_frees(threshold: int = LARGE_TENSOR_BYTES) -> bool:
    """Hold glibc's mmap threshold at `threshold` for this process (no effect elsewhere).
    Returns whether it was set."""
    done = mallopt(M_MMAP_THRESHOLD, threshold)
    if not done:  # not glibc: its own allocator's policy stays
        log.info("malloc's mmap threshold left as it is (not glibc)")
    return done
