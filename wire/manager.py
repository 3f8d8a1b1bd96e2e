"""Gateway <-> worker manager <-> inference worker messages. Typed msgspec, torch-free, no pickle.

The gateway sends a `Generate` per prompt; the manager routes it to the tenant's worker,
starting one if needed, which serves all of the tenant's models; the worker streams `Started`,
`Delta`s and `Done` (or `Failed`) back through the manager (an embedding request's vector in its
`Done`, no `Delta`). Several of them travel as one frame: a request's prompts as `Generates`
(gateway -> manager -> worker), replies as `Replies` (a worker's step's, and on from the manager
each gateway's share); a frame of one message is that message. `Abort` stops the prompts of a
request whose HTTP client went away (all of them in one message). Fine-tuning jobs are
controlled over the same sockets by the messages of `wire.jobs`, and the data dir's records by
those of `wire.store`.
"""

from __future__ import annotations

import msgspec

from wire.call.messages import NO_TARGETS, CallTargets, target_us
from wire.figures import ExecutorFigures
from wire.jobs import (
    JobCommand,
    JobState,
    TrainerAck,
    TrainerCheckpoint,
    TrainerControl,
    TrainerEvent,
    TrainerFinished,
    TrainerHello,
    TrainerStarted,
    TrainerStopped,
    TrainerThreads,
)
from wire.store import StoreAnswer, StoreCommand


class SamplingParams(msgspec.Struct, array_like=True, omit_defaults=True):
    max_tokens: int | None = 16  # None: as many as fit in the context
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    n: int = 1
    seed: int | None = None
    stop: list[str] = []
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # None: no logprobs; k: the chosen token's and k alternatives
    echo: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    logit_bias: dict[int, float] = {}  # token id -> added to its logit before sampling
    grammar: str | None = None  # an llguidance grammar every sequence must follow
    fit: bool = False  # max_tokens is the server's default, not the client's: at most what fits
    truncate: bool = False  # a chat too long for the context loses its earliest messages
    count: bool = False  # only count the prompt's tokens: Started and Done, nothing run
    embed: bool = False  # the prompt's embedding in its Done, no tokens generated
    dimensions: int = 0  # an embedding's first dimensions, normalized again (0: all)
    flex: bool = False  # the flex tier: behind all others (`workers.inference.fair`)
    collected: bool = False  # its client gets it whole: its Deltas merged (`...merging`)


FLEX_SHARE = 0.75  # of a worker's seats and of a tenant's KV budget, the most flex requests hold
MAX_BATCH = 32  # a worker's seats, the sequences it decodes at once, unless configured


def flex_seats(max_batch: int) -> int:
    """The seats flex requests may hold in an engine of `max_batch`: at least one, and one
    left for an interactive request where there are two or more."""
    return max(1, min(int(max_batch * FLEX_SHARE), max_batch - 1))


class ChatMessage(msgspec.Struct, array_like=True):
    role: str
    content: str
    name: str = ""  # the participant's, where the client named one (a template may show it)


class AdapterRef(msgspec.Struct, array_like=True):
    path: str  # a PEFT directory: adapter_config.json + adapter_model.safetensors
    peft_type: str


class TokenTargets(msgspec.Struct, frozen=True, array_like=True):
    """What a tenant's clients should meet end to end, in microseconds: the time to a request's
    first token and between one sequence's tokens (0: none asked). A worker derives the waits
    its executor calls carry (`CallTargets`) from them and what its steps measure
    (`workers.inference.pacing`); the gateway counts each token against them."""

    ttft_us: int = 0
    inter_token_us: int = 0

    @classmethod
    def from_ms(cls, ttft_ms: float = 0, inter_token_ms: float = 0) -> TokenTargets:
        return cls(target_us(ttft_ms), target_us(inter_token_ms))


NO_TOKEN_TARGETS = TokenTargets()


class Generate(msgspec.Struct, tag="generate", array_like=True):
    id: str
    tenant: str
    model: str  # the model id the client asked for
    params: SamplingParams
    adapter: AdapterRef | None = None
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    max_context: int = 0  # 0: the model's own limit
    fallback: bool = False  # serve with the base model if the adapter cannot be loaded
    targets: CallTargets = NO_TARGETS  # the tenant's latency targets in the executor
    token_targets: TokenTargets = NO_TOKEN_TARGETS  # and end to end (its calls' waits follow)
    waited_us: int = 0  # how long the gateway held it before sending (its TTFT clock ran)
    # when it reached the gateway, as the manager reckons it (its receipt less `waited_us`):
    # time.monotonic() of the manager's host, which the workers it starts share; a worker's
    # time to first token counts from it (0: from the worker's own receipt)
    arrived: float = 0.0
    group: str = ""  # the API request whose prompt it is: a tenant's requests take turns (fair.py)


class Abort(msgspec.Struct, tag="abort", array_like=True):
    ids: list[str]  # one message for all of a request's unfinished prompts


class Generates(msgspec.Struct, tag="generates", array_like=True):
    requests: list[Generate]  # handled in their order, as if each came alone


class TokenLogprob(msgspec.Struct, array_like=True):
    token: str
    logprob: float  # NaN: none (the first prompt token)
    top: list[tuple[str, float]]
    token_bytes: list[int]


class Started(msgspec.Struct, tag="started", array_like=True):
    id: str
    prompt_tokens: int
    fallback: bool = False
    prompt_text: str = ""  # for echo
    prompt_logprobs: list[TokenLogprob] | None = None
    backend: str = ""  # what computes it, the executor's dtype and device (system_fingerprint)


class Delta(msgspec.Struct, tag="delta", array_like=True):
    id: str
    index: int  # which of the n sequences
    text: str
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None  # stop | length
    tokens: int = 1  # the generated tokens its text holds (a collected request's: several)


class Done(msgspec.Struct, tag="done", array_like=True):
    id: str
    prompt_tokens: int
    completion_tokens: int
    embedding: bytes = b""  # an `embed` request's: float32, little-endian, of length 1


class Failed(msgspec.Struct, tag="failed", array_like=True):
    id: str
    status: int  # the HTTP status the gateway should answer with
    code: str
    message: str


Reply = Started | Delta | Done | Failed
_REPLIES = {Started, Delta, Done, Failed}


class Replies(msgspec.Struct, tag="replies", array_like=True):
    replies: list[Reply]  # passed on in their order, as if each came alone


def framed(messages: list[Generate] | list[Reply]) -> Generate | Generates | Reply | Replies:
    """`messages` (at least one, all requests or all replies) as one frame's message (a frame
    of other kinds would not decode on the other side: a TypeError here)."""
    if len(messages) == 1:
        return messages[0]
    kinds = {type(m) for m in messages}
    if kinds == {Generate}:
        return Generates(messages)
    if kinds <= _REPLIES:
        return Replies(messages)
    raise TypeError(f"not one frame's: {sorted(kind.__name__ for kind in kinds)}")


def unframed(message: Message) -> list[Message]:
    """The messages a frame's message carries: those of `Generates` or `Replies`, else itself."""
    if isinstance(message, Generates):
        return message.requests
    if isinstance(message, Replies):
        return message.replies
    return [message]


# worker <-> manager control
class Ready(msgspec.Struct, tag="ready", array_like=True):
    key: str
    pid: int
    load_s: float


class LoadFailed(msgspec.Struct, tag="load_failed", array_like=True):
    """The worker could not start (its base model did not build)."""

    key: str
    message: str
    code: str = "worker_start_failed"  # or executor_unavailable, device_unavailable


class AdapterCache(msgspec.Struct, tag="adapter_cache", array_like=True):
    """What a worker holds resident, sent when it changes (worker -> manager)."""

    key: str
    resident: int  # adapters
    bytes: int  # their memory, as its budget counts it
    loads: int  # since the worker started (a load in another's place included)
    let_go: int


class Unload(msgspec.Struct, tag="unload", array_like=True):
    """Let an adapter version go (it was deleted or withdrawn): a worker serves it no more."""

    model: str


class Stop(msgspec.Struct, tag="stop", array_like=True):
    pass


class WorkerThreads(msgspec.Struct, tag="worker_threads", array_like=True):
    """A worker's share of the cores from now on (told as workers start and stop): its forwards
    run on as many of them as their tokens keep busy (`workers.threads.ForwardThreads`)."""

    threads: int


# gateway <-> manager control
class Status(msgspec.Struct, tag="status", array_like=True):
    pass


class WorkerInfo(msgspec.Struct, array_like=True):
    key: str
    tenant: str
    models: list[str]  # the models (adapter versions, or the base) it has served and holds
    pid: int
    state: str
    inflight: int
    idle_s: float
    pinned: bool
    adapters: AdapterCache | None = None  # its last report
    threads: int = 0  # its share of the cores as it last heard it (0: not known)


class StatusReply(msgspec.Struct, tag="status_reply", array_like=True):
    workers: list[WorkerInfo]
    executor_ok: bool
    counters: dict[str, int]
    executor: ExecutorFigures | None = None
    training_executor: ExecutorFigures | None = None  # the jobs' own (the idle twin), if any
    training_executor_ok: bool | None = None  # whether that one answers; None: there is none


class Prefetch(msgspec.Struct, tag="prefetch", array_like=True):
    """A version now serves part of its name's traffic: the tenant's worker, if it is up, loads
    it before the first request (gateway -> manager -> worker)."""
    tenant: str
    model: str  # the version's id
    adapter: AdapterRef


Message = (Generate | Generates | Abort | Started | Delta | Done | Failed | Replies | Ready
           | LoadFailed | AdapterCache | Unload | WorkerThreads
           | Stop | Status | StatusReply | Prefetch | JobCommand | JobState | TrainerHello
           | TrainerControl | TrainerThreads | TrainerAck | TrainerStarted | TrainerEvent
           | TrainerCheckpoint | TrainerFinished | TrainerStopped | StoreCommand | StoreAnswer)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes | memoryview) -> Message:
    return _decoder.decode(data)
