"""The executor's own copies of the frozen weights, on 2 MiB pages where Linux allows.

A decode step reads each weight it uses once, end to end, so on 4 KiB pages every 4 KiB costs a
TLB miss and a page walk. tiny-llama's 12.8 MB head, one row, after 4 ms of other work (the gap
between two decode steps): 1.36-1.47 ms on 4 KiB pages, 0.92 ms on 2 MiB pages, 0.87-0.97 ms on
the plain model's own weights (mapped from the checkpoint file: 4 KiB pages in smaps, yet as
fast here; why was not found out). One tenant's greedy decode through a private executor:
1.42-1.62x of the plain model's time per token before, 1.25-1.41x after (bench NOTES,
"per-call overhead").

The copy goes into an anonymous private mapping, its whole 2 MiB pages advised MADV_HUGEPAGE
before anything is written, so the kernel backs them with huge pages where its
`transparent_hugepage` setting is `always` or `madvise`; the tail (under 2 MiB) is advised
MADV_NOHUGEPAGE, so that no weight holds most of a huge page it does not fill. Elsewhere (`never`,
no madvise, another device, tensors under 2 MiB) it is a plain copy. The mapping lives as long as
the tensor: torch holds the buffer.
"""

from __future__ import annotations

import math
import mmap

import torch

HUGE_PAGE = 2 << 20


def own_copy(tensor: torch.Tensor, huge_pages: bool = True) -> torch.Tensor:
    """A contiguous copy of `tensor` in memory of its own: on 2 MiB pages where it fills one."""
    if tensor.device.type != "cpu":
        return tensor.detach().clone(memory_format=torch.contiguous_format)
    copy = empty(tensor.shape, tensor.dtype, huge_pages)
    copy.copy_(tensor.detach())
    return copy


def empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype,
          huge_pages: bool = True) -> torch.Tensor:
    """An uninitialised host tensor: on 2 MiB pages where it fills one (and `huge_pages`)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if not (huge_pages and nbytes >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE")):
        return torch.empty(shape, dtype=dtype)
    whole = nbytes // HUGE_PAGE * HUGE_PAGE  # the tail stays on small pages: no 2 MiB for it
    # private: a shared anonymous mapping is shmem, whose huge pages another setting governs
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    start = -_address(mapping) % HUGE_PAGE  # the slack below starts it at a 2 MiB boundary
    advise(mapping, start, whole)  # before the first write faults pages in
    flat = torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes, offset=start)
    return flat.view(dtype).view(shape)


def advise(mapping: mmap.mmap, start: int, length: int) -> bool:
    """2 MiB pages for `length` bytes from `start` (a multiple of the page size), none for the
    rest of the mapping (under `always` too); False where the kernel refuses the advice (built
    without transparent huge pages: EINVAL), which leaves small pages and a working mapping."""
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE, start, length)
        mapping.madvise(mmap.MADV_NOHUGEPAGE, start + length)
    except OSError:
        return False
    return True


def _address(mapping: mmap.mmap) -> int:
    return torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
