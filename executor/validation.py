"""Every call is checked before it is queued, so a batch never fails because of one bad call."""

from __future__ import annotations

import torch
import zmq

from executor.registry import LayerRegistry
from wire import executor as P
from wire.shm import ShmBuffer
from wire.tensors import from_bytes, nbytes

FLOAT_DTYPES = ("float32", "bfloat16", "float16")
INDEX_DTYPES = ("int64", "int32")


class CallRejected(Exception):
    def __init__(self, call_id: int, code: P.ErrorCode, message: str) -> None:
        super().__init__(message)
        self.call_id = call_id
        self.code = code
        self.message = message


def check_call(call: P.Call, registry: LayerRegistry, shm: ShmBuffer | None,
               frames: list[zmq.Frame]) -> torch.Tensor:
    """The call's input tensor, or CallRejected saying what is wrong with it."""

    def reject(code: P.ErrorCode, message: str) -> CallRejected:
        return CallRejected(call.id, code, message)

    try:
        layer = registry.get(call.layer)
    except KeyError:
        raise reject(P.ErrorCode.UNKNOWN_LAYER, f"no layer with index {call.layer}") from None
    spec = layer.spec
    if spec.kind == P.LayerKind.EMBEDDING:
        if call.op != P.Op.FORWARD:
            raise reject(P.ErrorCode.UNSUPPORTED, f"{spec.name} is an embedding: forward only")
        if call.dtype not in INDEX_DTYPES or len(call.shape) != 1:
            raise reject(P.ErrorCode.BAD_TENSOR, f"{spec.name} takes a 1-D int64 tensor of ids")
        width_out = spec.out_features
    else:
        width_in = spec.out_features if call.op == P.Op.BACKWARD else spec.in_features
        width_out = spec.in_features if call.op == P.Op.BACKWARD else spec.out_features
        if call.dtype not in FLOAT_DTYPES:
            raise reject(P.ErrorCode.BAD_TENSOR, f"{spec.name} takes floating point rows")
        if len(call.shape) != 2 or call.shape[1] != width_in:
            raise reject(P.ErrorCode.BAD_TENSOR,
                         f"{spec.name} {call.op.name.lower()} takes [rows, {width_in}], "
                         f"got {list(call.shape)}")
    if any(d < 0 for d in call.shape):
        raise reject(P.ErrorCode.BAD_TENSOR, f"negative dimension in {list(call.shape)}")
    dtype = getattr(torch, call.dtype)
    x = _input(call, dtype, shm, frames, reject)
    if call.shm_out >= 0:
        if shm is None:
            raise reject(P.ErrorCode.BAD_TENSOR, "result asked in shared memory, none mapped")
        out_bytes = nbytes(registry.dtype, (call.shape[0], width_out))
        if call.shm_out % 64 or call.shm_out + out_bytes > shm.size:
            raise reject(P.ErrorCode.BAD_TENSOR, "result region is outside shared memory")
    if spec.kind == P.LayerKind.EMBEDDING and x.numel():
        low, high = int(x.min()), int(x.max())
        if low < 0 or high >= spec.in_features:
            raise reject(P.ErrorCode.BAD_TENSOR,
                         f"token ids must be in [0, {spec.in_features}), got [{low}, {high}]")
    return x


def _input(call: P.Call, dtype: torch.dtype, shm: ShmBuffer | None, frames: list[zmq.Frame],
           reject) -> torch.Tensor:
    if call.shm_in >= 0:
        if shm is None:
            raise reject(P.ErrorCode.BAD_TENSOR, "input said to be in shared memory, none mapped")
        try:
            return shm.view(call.shm_in, dtype, call.shape)
        except ValueError as exc:
            raise reject(P.ErrorCode.BAD_TENSOR, str(exc)) from None
    if len(frames) != 1:
        raise reject(P.ErrorCode.BAD_TENSOR, f"expected 1 tensor frame, got {len(frames)}")
    try:
        return from_bytes(frames[0].buffer, dtype, call.shape)
    except ValueError as exc:
        raise reject(P.ErrorCode.BAD_TENSOR, str(exc)) from None
