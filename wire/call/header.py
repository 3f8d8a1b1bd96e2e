"""The fixed binary layout of a doorbell call and its reply, read and written in place in the
client's shared memory (no allocation, no generic decoding on the hot path).

Layout of a doorbell client's segment:
    [0, 64)       request: seq u64, id u32, op u8, kind u8, dtype u8, ndim u8, layer u32,
                  rows u32, cols u32, shm_in u64, shm_out u64, decode target u32 (us),
                  prefill target u32 (us), marks u8 (`DECODE`: `Call.decode`, `FLEX`:
                  `Call.flex`)
    [64, 128)     reply:   seq u64, id u32, status u8, dtype u8, ndim u8, -, rows u32, cols u32,
                  text length u16
    [128, 4096)   reply text (an error's message, UTF-8)
    [4096, ...)   tensors (the call's input, then its result)

Each header is published by its `seq`, written after the rest (`publish_call`, `publish_reply`):
a reader that finds the seq it waits for (the client: its call's; the executor: one more than the
last it took) reads a complete header, and a half-written seq never matches. The store order this
relies on holds on x86-64; elsewhere nobody watches memory (`SPIN_SAFE`) and the doorbell pipe's
system calls order it. Status 0 is success; any other value is the index of the error code in
`ERROR_CODES`. Dtypes are indices into `DTYPE_CODES`.
"""

from __future__ import annotations

import platform
import struct

import torch

from wire.call.messages import ErrorCode

REQUEST_AT, REPLY_AT, TEXT_AT, DATA_AT = 0, 64, 128, 4096
TEXT_MAX = DATA_AT - TEXT_AT
SEQ = struct.Struct("<Q")
REQUEST_BODY = struct.Struct("<IBBBBIIIQQIIB")  # after the seq: id ... shm_out, targets, marks
DECODE, FLEX = 1, 2  # a call's marks (`Call.decode`, `Call.flex`)
REPLY_BODY = struct.Struct("<IBBBxIIH")  # after the seq: id, status, dtype, ndim, rows, cols, text
SPIN_SAFE = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
DTYPE_CODES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16,
                                        torch.int64, torch.int32)
CODE_OF: dict[torch.dtype, int] = {d: i for i, d in enumerate(DTYPE_CODES)}
ERROR_CODES: tuple[ErrorCode, ...] = (ErrorCode.INTERNAL, *(c for c in ErrorCode
                                                            if c != ErrorCode.INTERNAL))
OK = 0
STATUS_OF: dict[ErrorCode, int] = {c: i + 1 for i, c in enumerate(ERROR_CODES)}


def publish_call(mapped, seq: int, call_id: int, op: int, kind: int, dtype: int, ndim: int,
                 layer: int, rows: int, cols: int, shm_in: int, shm_out: int,
                 decode_target_us: int = 0, prefill_target_us: int = 0, marks: int = 0) -> None:
    REQUEST_BODY.pack_into(mapped, REQUEST_AT + 8, call_id, op, kind, dtype, ndim, layer, rows,
                           cols, shm_in, shm_out, decode_target_us, prefill_target_us, marks)
    SEQ.pack_into(mapped, REQUEST_AT, seq)


def read_call(mapped, expected_seq: int) -> tuple | None:
    """(seq, id, op, kind, dtype, ndim, layer, rows, cols, shm_in, shm_out, decode target,
    prefill target, marks) if the call with `expected_seq` is published, else None."""
    if SEQ.unpack_from(mapped, REQUEST_AT)[0] != expected_seq:
        return None
    return (expected_seq, *REQUEST_BODY.unpack_from(mapped, REQUEST_AT + 8))


def publish_reply(mapped, seq: int, call_id: int, status: int, dtype: int, ndim: int,
                  rows: int, cols: int, text_length: int = 0) -> None:
    REPLY_BODY.pack_into(mapped, REPLY_AT + 8, call_id, status, dtype, ndim, rows, cols,
                         text_length)
    SEQ.pack_into(mapped, REPLY_AT, seq)


def read_reply(mapped, expected_seq: int) -> tuple | None:
    """(id, status, dtype, ndim, rows, cols, text length) once the reply to `expected_seq` is
    published, else None."""
    if SEQ.unpack_from(mapped, REPLY_AT)[0] != expected_seq:
        return None
    return REPLY_BODY.unpack_from(mapped, REPLY_AT + 8)


def write_error(mapped, seq: int, call_id: int, code: ErrorCode, message: str) -> None:
    text = message.encode("utf-8", "replace")[:TEXT_MAX]
    mapped[TEXT_AT:TEXT_AT + len(text)] = text
    publish_reply(mapped, seq, call_id, STATUS_OF[code], 0, 0, 0, 0, len(text))


def read_error(mapped, status: int, length: int) -> tuple[ErrorCode, str]:
    code = ERROR_CODES[status - 1] if 0 < status <= len(ERROR_CODES) else ErrorCode.INTERNAL
    return code, bytes(mapped[TEXT_AT:TEXT_AT + min(length, TEXT_MAX)]).decode("utf-8",
                                                                                "replace")
