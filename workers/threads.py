"""How many torch threads a worker's or a trainer's own compute runs on (attention, norms,
adapters, KV cache; a trainer's backward and optimizer): its share of the cores (the worker
manager's, `workers.manager.capacity.ThreadShare`), but no more than the tokens of the forward
or step at hand keep busy. Under OpenMP's PASSIVE wait policy each op that runs on a second
thread wakes it, which a small forward does not repay (a decode step of a few rows loses on a
second thread), while a long prompt's prefill gains. Two threads against one on a 2-core Xeon
(bench/NOTES.md): a worker's prefill alone, 128 tokens 5 % slower, 512 15 % faster, 2,048 20-27 %
faster; a trainer's remote llama-160m LoRA step, 2 x 256 tokens 5 % and 2 x 512 17 % faster,
2 x 128 as fast at a trainer's nice 10 and SCHED_BATCH (one thread 1-11 % faster without them).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from workers.forward_inputs import forward_tokens

log = logging.getLogger("workers.threads")
TOKENS_PER_THREAD = 128


def step_threads(share: int, tokens: int) -> int:
    """Threads for a forward or step of `tokens` (a trainer's: at most a micro-batch's) out of
    `share`."""
    return max(1, min(share, tokens // TOKENS_PER_THREAD))


def use_threads(threads: int) -> None:
    """torch's threads in this process from now on (set only when they change)."""
    if threads != torch.get_num_threads():
        log.debug("threads %d -> %d", torch.get_num_threads(), threads)
        torch.set_num_threads(threads)


class ForwardThreads:
    """A worker's threads, set before each forward of its models (`attach`) by the forward's
    tokens, out of the share the manager last told it (`share`): a decode step of a few rows
    runs on one thread, a long prompt's prefill on up to the whole share."""

    def __init__(self, share: int) -> None:
        self.share = share

    def attach(self, model: torch.nn.Module) -> None:
        """Every forward of `model`'s decoder, however it is called (a peft model calls its base
        model's `forward` directly; the decoder within is always called as a module)."""
        decoder = getattr(model, "base_model", model)
        decoder.register_forward_pre_hook(self._before, with_kwargs=True)

    def _before(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        tokens = forward_tokens(args, kwargs)
        count = 1 if tokens is None else tokens.shape[0] * tokens.shape[1]
        use_threads(step_threads(self.share, count))
