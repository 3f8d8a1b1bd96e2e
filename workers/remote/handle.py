"""What a worker's model needs from an executor, whichever transport sits behind it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Protocol

import torch

from wire.call.header import DECODE, FLEX
from wire.call.messages import CallKind, LayerSpec, Op

_DECODING: ContextVar[bool] = ContextVar("decoding", default=False)
_FLEXING: ContextVar[bool] = ContextVar("flexing", default=False)


@contextmanager
def _marked(mark: ContextVar[bool], value: bool) -> Iterator[None]:
    token = mark.set(value)
    try:
        yield
    finally:
        mark.reset(token)


def decode_step() -> AbstractContextManager[None]:
    """The calls made inside carry running sequences' next tokens (`Call.decode`): the executor
    runs them in its decode lane, first among ready work and never sliced, whatever their rows
    (a large batch, or prompts' chunks packed beside the rows)."""
    return _marked(_DECODING, True)


def decoding() -> bool:
    """Whether the calls made now are a decode step's (`decode_step`)."""
    return _DECODING.get()


def flex_step(flex: bool) -> AbstractContextManager[None]:
    """Where `flex`, the calls made inside carry flex requests' rows only (`Call.flex`): the
    executor runs them after every other inference call."""
    return _marked(_FLEXING, flex)


def flexing() -> bool:
    """Whether the calls made now carry flex requests' rows only (`flex_step`)."""
    return _FLEXING.get()


def marks() -> int:
    """The calls' marks as a doorbell header carries them (`wire.call.header`)."""
    return (DECODE if _DECODING.get() else 0) | (FLEX if _FLEXING.get() else 0)


class ExecutorError(RuntimeError):
    """The executor refused or failed a call."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"executor error ({code}): {message}")
        self.code = code


class ExecutorUnavailable(ExecutorError):
    """The executor cannot be reached (down, restarting, or not answering in time)."""

    def __init__(self, message: str) -> None:
        super().__init__("unavailable", message)


class ExecutorHandle(Protocol):
    model: str
    dtype: torch.dtype
    layers: list[LayerSpec]
    device: str  # where the executor computes

    def call(self, op: Op, layer: int, x: torch.Tensor, kind: CallKind) -> torch.Tensor:
        """Run `op` of base layer `layer` on x [rows, in] (ids: [rows]).

        The result, [rows, out] in the executor's dtype, may live in a transport buffer: it is
        valid until the next call on this handle, so callers copy what they keep.
        """
        ...

    def close(self) -> None:
        """Let go of the executor (idempotent): a trainer closes its handle when it ends."""
        ...
