"""The doorbell call's binary header: written in place, read in place, published by its seq."""

from __future__ import annotations

import mmap

from wire.call import header as H
from wire.call.messages import TARGET_MAX_US, CallKind, ErrorCode, Op


def test_a_call_is_read_only_once_published_and_round_trips() -> None:
    mapped = mmap.mmap(-1, H.DATA_AT)
    H.REQUEST_BODY.pack_into(mapped, H.REQUEST_AT + 8, 9, Op.BACKWARD, CallKind.TRAINING, 1, 2,
                             300, 5, 64, H.DATA_AT, H.DATA_AT + 1024, 0, 0, 0)
    assert H.read_call(mapped, 1) is None  # the body alone: not published yet
    H.publish_call(mapped, 1, 9, Op.BACKWARD, CallKind.TRAINING, 1, 2, 300, 5, 64, H.DATA_AT,
                   H.DATA_AT + 1024)
    assert H.read_call(mapped, 1) == (1, 9, Op.BACKWARD, CallKind.TRAINING, 1, 2, 300, 5, 64,
                                      H.DATA_AT, H.DATA_AT + 1024, 0, 0, 0)  # no targets asked
    assert H.read_call(mapped, 2) is None  # the executor waits for the next seq only
    # the tenants' latency targets, up to the largest a u32 of microseconds holds, and the marks
    # of a decode step's call of flex requests' rows
    H.publish_call(mapped, 2, 10, Op.FORWARD, CallKind.INFERENCE, 0, 2, 3, 1, 64, H.DATA_AT,
                   H.DATA_AT + 1024, 250, TARGET_MAX_US, marks=H.DECODE | H.FLEX)
    assert H.read_call(mapped, 2)[-3:] == (250, TARGET_MAX_US, 3)
    assert H.REQUEST_AT + 8 + H.REQUEST_BODY.size <= H.REPLY_AT  # the request fits its slot


def test_replies_and_errors_round_trip() -> None:
    mapped = mmap.mmap(-1, H.DATA_AT)
    H.publish_reply(mapped, 4, 9, H.OK, 0, 2, 5, 192)
    assert H.read_reply(mapped, 3) is None
    assert H.read_reply(mapped, 4) == (9, H.OK, 0, 2, 5, 192, 0)
    H.write_error(mapped, 5, 10, ErrorCode.BAD_TENSOR, "é" * 5000)
    _, status, *_, length = H.read_reply(mapped, 5)
    code, message = H.read_error(mapped, status, length)
    assert code == ErrorCode.BAD_TENSOR and length <= H.TEXT_MAX
    assert message.startswith("éé") and len(message.encode()) <= H.TEXT_MAX
    for code in ErrorCode:
        H.write_error(mapped, 6, 1, code, "x")
        assert H.read_error(mapped, H.read_reply(mapped, 6)[1], 1) == (code, "x")
