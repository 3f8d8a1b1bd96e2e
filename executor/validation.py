"""Every call is checked before it is queued, so a batch never fails because of one bad call.

The checks are table lookups precomputed per layer (`CallTable`): which ops a layer takes, the
width of its input and result for each op, and how many rows an embedding table has. A doorbell
call's header is checked the same way as a socket call's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import zmq

from executor.ports import DoorbellPort, Header
from wire.call import messages as P
from wire.call.header import DATA_AT, DTYPE_CODES
from wire.call.shm import ShmBuffer
from wire.call.tensors import DTYPES, from_bytes, nbytes

FLOATS = frozenset({torch.float32, torch.bfloat16, torch.float16})
INDICES = frozenset({torch.int64, torch.int32})
KINDS = frozenset(int(k) for k in P.CallKind)
MAX_ROWS = 1 << 24


class CallRejected(Exception):
    def __init__(self, call_id: int, code: P.ErrorCode, message: str) -> None:
        super().__init__(message)
        self.call_id = call_id
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class LayerShape:
    name: str
    table_rows: int  # embeddings: ids must be below this; 0 for linear layers
    widths: dict[int, tuple[int, int]]  # op -> (input width, result width)


class CallTable:
    def __init__(self, specs: list[P.LayerSpec]) -> None:
        self.layers: list[LayerShape] = []
        for s in specs:
            if s.kind in (P.LayerKind.EMBEDDING, P.LayerKind.LEAD):
                self.layers.append(LayerShape(s.name, s.in_features,
                                              {P.Op.FORWARD: (0, s.out_features)}))
            elif s.kind in (P.LayerKind.GREEDY, P.LayerKind.LOSS):
                self.layers.append(LayerShape(s.name, 0, {
                    P.Op.FORWARD: (s.in_features, s.out_features)}))
            elif s.kind == P.LayerKind.STRETCH:  # backward: [inputs | residual output |
                # output grads] -> grads
                self.layers.append(LayerShape(s.name, 0, {
                    P.Op.FORWARD: (s.in_features, s.out_features),
                    P.Op.BACKWARD: (s.in_features + s.splits[0] + s.out_features,
                                    s.in_features)}))
            elif s.kind == P.LayerKind.KEPT:  # backward: [residual output | output grads |
                # what the forward handed back] -> grads
                self.layers.append(LayerShape(s.name, 0, {
                    P.Op.FORWARD: (s.in_features, s.out_features),
                    P.Op.BACKWARD: (s.splits[0] + s.out_features, s.in_features)}))
            else:
                forward = (s.in_features, s.out_features)
                self.layers.append(LayerShape(s.name, 0, {
                    P.Op.FORWARD: forward, P.Op.FORWARD_NOBIAS: forward,
                    P.Op.BACKWARD: (s.out_features, s.in_features)}))

    def width_out(self, call_id: int, layer: int, op: int, dtype: torch.dtype,
                  shape: tuple[int, ...]) -> int:
        """The result's width for a call of `shape` and `dtype`, or CallRejected."""
        if not 0 <= layer < len(self.layers):
            raise CallRejected(call_id, P.ErrorCode.UNKNOWN_LAYER, f"no layer with index {layer}")
        entry = self.layers[layer]
        widths = entry.widths.get(op)
        if widths is None:
            ops = " or ".join(P.Op(o).name.lower() for o in entry.widths)
            raise CallRejected(call_id, P.ErrorCode.UNSUPPORTED,
                               f"{entry.name} takes only {ops}")
        width_in, width_out = widths
        if entry.table_rows:
            if dtype not in INDICES or len(shape) != 1:
                raise CallRejected(call_id, P.ErrorCode.BAD_TENSOR,
                                   f"{entry.name} takes a 1-D int64 tensor of ids")
        elif dtype not in FLOATS:
            raise CallRejected(call_id, P.ErrorCode.BAD_TENSOR,
                               f"{entry.name} takes floating point rows")
        elif len(shape) != 2 or shape[1] != width_in:
            raise CallRejected(call_id, P.ErrorCode.BAD_TENSOR,
                               f"{entry.name} {P.Op(op).name.lower()} takes [rows, {width_in}], "
                               f"got {list(shape)}")
        if not 0 <= shape[0] <= MAX_ROWS:
            raise CallRejected(call_id, P.ErrorCode.BAD_TENSOR, f"bad row count in {list(shape)}")
        return width_out

    def check_ids(self, call_id: int, layer: int, x: torch.Tensor) -> None:
        rows = self.layers[layer].table_rows
        if rows and x.numel():
            if x.numel() <= 32:  # a decode step's ids: a list is cheaper than a reduction
                ids = x.tolist()
                low, high = min(ids), max(ids)
            else:
                low, high = map(int, torch.aminmax(x))
            if low < 0 or high >= rows:
                raise CallRejected(call_id, P.ErrorCode.BAD_TENSOR,
                                   f"token ids must be in [0, {rows}), got [{low}, {high}]")


def check_doorbell(table: CallTable, port: DoorbellPort, header: Header,
                   result_dtype: torch.dtype) -> torch.Tensor:
    """A doorbell call's input, a view of the client's memory; or CallRejected."""
    _, call_id, op, kind, dtype_code, ndim, layer, rows, cols, shm_in, shm_out, *_ = header
    if kind not in KINDS:
        raise CallRejected(call_id, P.ErrorCode.BAD_MESSAGE, f"no kind of call {kind}")
    if dtype_code >= len(DTYPE_CODES) or ndim not in (1, 2) or (ndim == 1) != (cols == 0):
        raise CallRejected(call_id, P.ErrorCode.BAD_TENSOR, "bad dtype or rank in the header")
    dtype = DTYPE_CODES[dtype_code]
    shape = (rows, cols) if ndim == 2 else (rows,)
    width = table.width_out(call_id, layer, op, dtype, shape)
    if shm_in < DATA_AT or shm_out < DATA_AT:
        raise CallRejected(call_id, P.ErrorCode.BAD_TENSOR, "tensors must lie after the headers")
    try:
        x = port.view(shm_in, dtype, rows, cols)
        out = port.view(shm_out, result_dtype, rows, width)
    except ValueError as exc:
        raise CallRejected(call_id, P.ErrorCode.BAD_TENSOR, str(exc)) from None
    if shm_in < shm_out + out.nbytes and shm_out < shm_in + x.nbytes and rows:
        raise CallRejected(call_id, P.ErrorCode.BAD_TENSOR, "input and result overlap")
    table.check_ids(call_id, layer, x)
    return x


def check_call(call: P.Call, table: CallTable, shm: ShmBuffer | None, frames: list[zmq.Frame],
               result_dtype: torch.dtype) -> torch.Tensor:
    """A socket call's input tensor, or CallRejected saying what is wrong with it."""

    def reject(code: P.ErrorCode, message: str) -> CallRejected:
        return CallRejected(call.id, code, message)

    dtype = DTYPES.get(call.dtype)
    if dtype is None:
        raise reject(P.ErrorCode.BAD_TENSOR, f"unsupported dtype {call.dtype!r}")
    if any(d < 0 for d in call.shape):
        raise reject(P.ErrorCode.BAD_TENSOR, f"negative dimension in {list(call.shape)}")
    if not (0 <= call.decode_target_us <= P.TARGET_MAX_US
            and 0 <= call.prefill_target_us <= P.TARGET_MAX_US):
        raise reject(P.ErrorCode.BAD_MESSAGE, f"latency targets are 0..{P.TARGET_MAX_US} us")
    width_out = table.width_out(call.id, call.layer, call.op, dtype, tuple(call.shape))
    x = _input(call, dtype, shm, frames, reject)
    if call.shm_out >= 0:
        if shm is None:
            raise reject(P.ErrorCode.BAD_TENSOR, "result asked in shared memory, none mapped")
        out_bytes = nbytes(result_dtype, (call.shape[0], width_out))
        if call.shm_out % 64 or call.shm_out + out_bytes > shm.size:
            raise reject(P.ErrorCode.BAD_TENSOR, "result region is outside shared memory")
    table.check_ids(call.id, call.layer, x)
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
