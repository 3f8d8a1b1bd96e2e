"""Worker <-> executor wire protocol: typed msgspec messages plus raw tensor frames. No pickle.

A message is one or two ZeroMQ frames: a msgpack header (one of the Structs below, tagged) and,
when a tensor does not travel through the client's shared memory, its raw bytes. On the same
host, calls and their replies may travel as headers in shared memory instead (`wire.call.doorbell`).
Both ends import this module; it imports nothing from the rest of the executor.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import msgspec

from wire.figures import ExecutorFigures

PROTOCOL_VERSION = 14  # 2: binary doorbell headers, stretches; 3: device call buffers;
# 4: device buffers name their GPU by UUID; 5: stats answered as typed figures; 6: the lead;
# 7: stretches and the lead return the normed residual stream before the next q/k/v; 8: greedy;
# 9: a stretch's backward takes its forward's residual output too; 10: calls carry their
# tenants' latency targets; 11: the welcome names the executor's own targets; 12: the head's
# loss; 13: kept stretches; 14: flex rows' calls


TARGET_MAX_US = 2**32 - 1  # a target travels as an unsigned 32-bit count of microseconds


def target_us(ms: float) -> int:
    """A target in milliseconds as messages carry it: whole microseconds, none shorter than one
    (0: none asked)."""
    return max(round(ms * 1000), 1) if ms > 0 else 0


class CallTargets(msgspec.Struct, frozen=True, array_like=True):
    """How long a call may wait in the executor before its batch runs, as its tenants ask (the
    tightest of the tenants whose rows it carries), for each lane it may fall in: the executor
    tells a decode step from a prefill by the call's `decode` mark, else by its rows. 0: the
    executor's own target for the lane."""

    decode_us: int = 0
    prefill_us: int = 0

    @classmethod
    def from_ms(cls, decode_ms: float = 0, prefill_ms: float = 0) -> CallTargets:
        return cls(target_us(decode_ms), target_us(prefill_ms))


NO_TARGETS = CallTargets()


def tightest(targets: Iterable[CallTargets]) -> CallTargets:
    """The targets of a call that carries the rows of several tenants: per lane the smallest one
    asked for (0, the executor's own, where none asked)."""
    decode = prefill = 0
    for t in targets:
        if t.decode_us and (not decode or t.decode_us < decode):
            decode = t.decode_us
        if t.prefill_us and (not prefill or t.prefill_us < prefill):
            prefill = t.prefill_us
    return CallTargets(decode, prefill) if decode or prefill else NO_TARGETS


class Op(enum.IntEnum):
    FORWARD = 0  # y = x W^T + b (linear), table lookup (embedding)
    FORWARD_NOBIAS = 1  # y = x W^T (privacy mode never sends it: its pads stay in the tenant)
    BACKWARD = 2  # grad_x = grad_y W; nothing is kept between forward and backward


class CallKind(enum.IntEnum):
    INFERENCE = 0  # latency-sensitive
    TRAINING = 1  # throughput-oriented


class LayerKind(enum.IntEnum):
    LINEAR = 0
    EMBEDDING = 1
    GROUP = 2  # several linear layers that share one input, run as one matmul
    STRETCH = 3  # the frozen part of a decoder layer between two attentions (backward: from
    #             [inputs | the forward's residual output | output gradients] to input gradients)
    LEAD = 4  # token ids -> [embedding | its norm | the first layer's q/k/v]: forward only,
    #          ids as an embedding's (in_features: the table's rows)
    GREEDY = 5  # the last stretch through the head, then the lead of each row's greedy choice:
    #            [tail's output | the choice (wire.call.digits) | the lead's]: forward only
    LOSS = 6  # the output head's token loss: [hidden | the label as digits] -> [loss | its
    #          remainder | right | the hidden's gradient] (`+loss`, training), or without the
    #          gradient (`+eval`, evaluation): forward only (executor.loss)
    KEPT = 7  # a stretch for training that hands back what its backward needs: forward
    #          [inputs] -> [the stretch's result | the residual before the MLP | the MLP's input
    #          products]; backward [residual output | output gradients | those two] -> input
    #          gradients, nothing computed twice (executor.kept)


class ErrorCode(enum.StrEnum):
    BAD_MESSAGE = "bad_message"
    UNKNOWN_CLIENT = "unknown_client"
    UNKNOWN_LAYER = "unknown_layer"
    BAD_TENSOR = "bad_tensor"
    UNSUPPORTED = "unsupported"
    INTERNAL = "internal"
    UNAVAILABLE = "unavailable"  # the executor cannot compute now (a rank of its group is down)


class LayerSpec(msgspec.Struct, frozen=True, array_like=True):
    index: int
    name: str
    kind: LayerKind
    in_features: int  # embeddings: number of rows in the table
    out_features: int
    has_bias: bool
    members: tuple[str, ...] = ()  # groups: member layer names, in output order; stretches:
    #                                the output projection, then where the next q/k/v go
    splits: tuple[int, ...] = ()  # groups: out_features of each member; stretches and the
    #                               lead: the hidden width (twice, the stream and its norm, where
    #                               q/k/v or a head follow), then each next target's


class Hello(msgspec.Struct, tag="hello", array_like=True):
    client: str
    pid: int
    version: int = PROTOCOL_VERSION
    shm_name: str | None = None
    shm_size: int = 0
    shm_token: bytes = b""
    doorbell: str | None = None  # path prefix of the worker's doorbell pipes (same host only)


class Welcome(msgspec.Struct, tag="welcome", array_like=True):
    model: str
    dtype: str
    layers: list[LayerSpec]
    shm: bool
    version: int = PROTOCOL_VERSION
    doorbell: bool = False  # calls go through shared memory and the doorbell pipes
    device: str = "cpu"  # where the executor computes (a client weighs calls against compute)
    targets: CallTargets = NO_TARGETS  # the executor's own waits per lane (what 0 stands for)


class Remap(msgspec.Struct, tag="remap", array_like=True):
    """The client's shared memory grew: map the new segment instead."""

    shm_name: str
    shm_size: int
    shm_token: bytes


class Mapped(msgspec.Struct, tag="mapped", array_like=True):
    ok: bool


class ShareDevice(msgspec.Struct, tag="share_device", array_like=True):
    """The client's call buffer on a GPU (`wire.call.cuda_ipc`): once mapped, a doorbell call's
    offsets point into it instead of the shared memory; refused (`Mapped(False)`), or when
    `size` is 0, calls go back to the shared memory. The GPU is named by its UUID: the two
    processes may number their GPUs differently."""

    uuid: str
    handle: bytes
    size: int
    offset: int  # of the buffer inside the allocation the handle names
    event: bytes
    event_sync: bool
    token: bytes


class Call(msgspec.Struct, tag="call", array_like=True):
    id: int
    op: Op
    layer: int
    kind: CallKind
    dtype: str
    shape: tuple[int, ...]
    shm_in: int = -1  # byte offset of the input in the client's shared memory; -1: next frame
    shm_out: int = -1  # byte offset for the result in shared memory; -1: reply with a frame
    # the wait the call's tenants allow it in the executor (`CallTargets`), per lane it may fall in
    decode_target_us: int = 0
    prefill_target_us: int = 0
    # it carries running sequences' next tokens: a decode step, in the decode lane whatever its
    # rows (one with prompts' chunks packed beside them has more); False: the lane by its rows
    decode: bool = False
    # every row it carries is a flex request's (`SamplingParams.flex`): the flex lane, after
    # every other inference call (`executor.lanes`)
    flex: bool = False


class Result(msgspec.Struct, tag="result", array_like=True):
    id: int
    dtype: str
    shape: tuple[int, ...]
    shm: bool  # True: the result is in shared memory at the call's shm_out


class Error(msgspec.Struct, tag="error", array_like=True):
    id: int
    code: ErrorCode
    message: str


class StatsRequest(msgspec.Struct, tag="stats", array_like=True):
    pass


class Stats(msgspec.Struct, tag="stats_reply", array_like=True):
    figures: ExecutorFigures


class Ping(msgspec.Struct, tag="ping", array_like=True):
    pass


class Pong(msgspec.Struct, tag="pong", array_like=True):
    model: str
    clients: int
    known: bool  # False: the executor does not know this worker (it restarted): hello again


class Bye(msgspec.Struct, tag="bye", array_like=True):
    pass


ToExecutor = Hello | Remap | ShareDevice | Call | StatsRequest | Ping | Bye
FromExecutor = Welcome | Mapped | Result | Error | Stats | Pong

_encoder = msgspec.msgpack.Encoder()
_to_executor = msgspec.msgpack.Decoder(ToExecutor)
_from_executor = msgspec.msgpack.Decoder(FromExecutor)


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode_request(data: bytes | memoryview) -> ToExecutor:
    return _to_executor.decode(data)


def decode_reply(data: bytes | memoryview) -> FromExecutor:
    return _from_executor.decode(data)
