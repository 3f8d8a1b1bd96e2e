"""torch's CPU threads around the data plane's copies (and a stretch's elementwise ops, norms and
residual adds: `executor.stretches`, `executor.elementwise`): one thread where splitting a copy
over threads costs more than it saves.

torch splits a CPU copy of 32,768 elements or more over its threads; with the others asleep
(OMP_WAIT_POLICY=PASSIVE, the executor's setting, or any quiet moment), waking them costs more
than their share of the copy until the copy is ~2 MB (a 2-core Xeon VM, medians, fp32, into
shared memory: 0.8 MB 130 against 87 us on one thread, a clone 143 against 74; 3.1 MB 179
against 249). A call's input going into shared memory and its result coming out (the executor's
writing, the client's copy) are mostly that size in training: 32 rows of a 160M model's MLP.
The same holds for any elementwise op in the executor's compute thread (not the main one, under
PASSIVE): [256, 768] x itself took 61-85 us on two threads against 25 on one (11 in a main thread
whose idle threads spin); 12 kept llama-160m stretches, forward and backward, 256 rows 359 ->
334 ms and 64 rows 156 -> 136 ms with their norms and residual adds on one thread.
"""

from __future__ import annotations

import contextlib

import torch

SPLIT_MIN = 32768  # elements: torch's grain size, below which a copy stays on one thread
SPLIT_PAYS = 1 << 19  # elements (2 MB of fp32): from here on two threads copy faster
_AS_IS = contextlib.nullcontext()


class one_thread:  # lower case: used as a function, `with one_thread():`
    """torch's CPU threads down to one inside the block, and back. A class, not a generator: it
    sits on the tiny-product path of every decode step (0.5-0.8 against 1.4-1.7 us a use)."""

    __slots__ = ("threads",)

    def __enter__(self) -> None:
        self.threads = torch.get_num_threads()
        if self.threads > 1:
            torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        if self.threads > 1:
            torch.set_num_threads(self.threads)


def copy_threads(t: torch.Tensor) -> one_thread | contextlib.nullcontext:
    """The threads for copying `t`: one where torch would split it and that costs more than it
    saves (a host tensor of SPLIT_MIN to SPLIT_PAYS elements), else as they are."""
    if SPLIT_MIN <= t.numel() < SPLIT_PAYS and t.device.type == "cpu":
        return one_thread()
    return _AS_IS
