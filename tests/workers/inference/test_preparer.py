"""Requests prepared by a thread of the worker's own (`workers.inference.preparer`): a prompt's ids
are those `prompt_ids` gives, its constraint compiled as the engine compiles it, handed back in
the order they came; an abort before it is ready drops it; one whose preparing breaks fails
alone; and, in a worker against a real executor, one request's decode steps go on while
another's 2 MB prompt is tokenized, while a short prompt is prepared in the loop itself and
joins the next step; a frame's requests are answered each in a frame of its own; aborts that
come one after another are taken out together, before the next other message; and a burst of
requests in one frame holds up the steps of sequences that decode, or the first token of a
prompt taken, for at most `DRAIN_S` a drain (the rest wait, in order, for the drains that
follow, where an abort reaches them), while with none decoding a drain of embeddings takes them
all; a chat behind them is taken next."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import zmq

from tests.helpers import ExecutorProcess
from wire import manager as W
from wire.spawner import WorkerSpec
from workers.inference.adapters import Adapters
from workers.inference.grammar import Grammars
from workers.inference.intake import Intake
from workers.inference.preloaded import Preloaded, preload
from workers.inference.preparer import Preparer, heavy, prepare
from workers.inference.prompt import prompt_ids
from workers.inference.worker import _receive, build_adapters
from workers.threads import ForwardThreads

MODEL = "tiny-llama"
LONG = ("The quick brown fox jumps over the lazy dog. " * 45_000)[:1_900_000]


def asked(request_id: str, max_tokens: int = 4, **prompt) -> W.Generate:
    return W.Generate(request_id, "acme", MODEL, W.SamplingParams(
        max_tokens=max_tokens, temperature=0), **prompt)


def collected(preparer: Preparer, count: int) -> list:
    done, deadline = [], time.monotonic() + 60
    while len(done) < count:
        assert time.monotonic() < deadline
        if preparer.wake.poll(100):
            done += preparer.ready()
    return done


def test_prepared_in_order_as_inline_and_an_aborted_one_dropped() -> None:
    preloaded = preload(MODEL)
    tokenizer = preloaded.tokenizer
    grammars = Grammars(tokenizer, len(tokenizer))
    ctx = zmq.Context()
    preparer = Preparer(ctx, lambda m: prepare(m, tokenizer, preloaded.max_context, grammars))
    json_mode = asked("json", prompt="Hi")
    json_mode.params.grammar = '%llguidance {}\nstart: %json {"type": "object"}\n'
    sent = [asked("long", prompt=LONG), asked("gone", prompt="Bye"),
            asked("chat", messages=[W.ChatMessage("user", "Hello")]), json_mode,
            asked("bad", prompt_ids=[])]
    try:
        for message in sent:
            preparer.submit(message)
        preparer.drop("gone")
        done = collected(preparer, 4)
    finally:
        preparer.close()
        ctx.term()
    assert [made.message.id for made in done] == ["long", "chat", "json", "bad"]
    long, chat, json, bad = done
    assert long.ids == prompt_ids(sent[0], tokenizer, preloaded.max_context)
    assert chat.ids == prompt_ids(sent[2], tokenizer) and chat.matcher is None
    assert json.matcher is not None and not json.matcher.is_error()
    assert json.ids == tokenizer.encode("Hi") and bad.failed is None and bad.ids == []


def test_a_request_whose_preparing_breaks_fails_alone() -> None:
    ctx = zmq.Context()
    preparer = Preparer(ctx, lambda m: 1 / 0 if m.id == "broken" else prepare(
        m, preload(MODEL).tokenizer, 2048))
    try:
        for request_id in ("broken", "fine"):
            preparer.submit(asked(request_id, prompt="Hi"))
        broken, fine = collected(preparer, 2)
    finally:
        preparer.close()
        ctx.term()
    assert (broken.failed.status, broken.failed.code) == (500, "internal_error")
    assert fine.failed is None and fine.ids


@dataclass
class Worker:
    """A worker's loop in this process, its manager's socket beside it."""
    preloaded: Preloaded
    adapters: Adapters
    threads: ForwardThreads
    manager: zmq.Socket
    sock: zmq.Socket
    preparer: Preparer
    key: bytes
    intake: Intake = field(default_factory=Intake)  # kept across drains, as a worker's

    def send(self, message: W.Message) -> None:
        self.manager.send_multipart([self.key, W.encode(message)])

    def receive(self) -> None:
        assert _receive(self.sock, self.adapters, self.preloaded, self.threads, self.intake,
                        self.preparer)


@contextlib.contextmanager
def worker_on(executor_for, key: str) -> Iterator[Worker]:
    llama: ExecutorProcess = executor_for(MODEL)
    preloaded = preload(MODEL)
    spec = WorkerSpec(key=key, tenant="acme", base=MODEL, executor=llama.endpoint,
                      manager="inproc://unused", threads=1)
    threads = ForwardThreads(spec.threads)
    adapters = build_adapters(spec, preloaded, threads)
    ctx = zmq.Context()
    manager, sock = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    preparer = Preparer(ctx, lambda m: prepare(m, preloaded.tokenizer, preloaded.max_context))
    try:
        manager.bind(f"inproc://{key}-manager")
        sock.setsockopt(zmq.IDENTITY, key.encode())
        sock.connect(f"inproc://{key}-manager")
        yield Worker(preloaded, adapters, threads, manager, sock, preparer, key.encode())
    finally:
        preparer.close()
        sock.close(0)
        manager.close(0)
        ctx.term()


def test_decode_steps_go_on_while_a_long_prompt_is_tokenized(executor_for) -> None:
    steps_before, answered, deadline = 0, None, time.monotonic() + 120
    with worker_on(executor_for, "prepared-worker") as worker:
        worker.send(asked("decoding", 1000, prompt_ids=[5, 6, 7]))
        worker.send(asked("long", prompt=LONG))
        while answered is None:
            assert time.monotonic() < deadline
            worker.receive()
            while worker.manager.poll(0):
                answered = W.decode(worker.manager.recv_multipart()[1])
            if answered is None and worker.adapters.engine.has_work():
                worker.adapters.engine.step()
                steps_before += 1
    assert isinstance(answered, W.Failed) and answered.id == "long"  # past the context
    assert answered.code == "context_length_exceeded", answered
    assert steps_before >= 5, steps_before  # inline, the loop stood still until it was told
    assert not heavy(asked("short", prompt="Hello " * 100)) and heavy(asked("long", prompt=LONG))


def test_a_short_prompt_is_prepared_in_the_loop_and_joins_at_once(executor_for) -> None:
    """No hand-over for a prompt tokenized in a few milliseconds: the request is in its engine
    when the loop's receive returns, so it joins the very next step."""
    with worker_on(executor_for, "inline-worker") as worker:
        worker.send(asked("short", messages=[W.ChatMessage("user", "Hello " * 100)]))
        worker.receive()
        assert worker.adapters.engine.has_work()


def test_a_frames_requests_are_answered_each_in_one_frame(executor_for) -> None:
    """Prompts to count (as the Responses API's input_tokens asks) in one frame: each one's
    Started and Done come back together, as one frame, in the order asked."""
    counted = [W.Generate(f"c{i}", "acme", MODEL, W.SamplingParams(count=True),
                          prompt_ids=list(range(1, i + 2))) for i in range(3)]
    with worker_on(executor_for, "counting-worker") as worker:
        worker.send(W.Generates(counted))
        worker.receive()
        frames = []
        while worker.manager.poll(100):
            frames.append(W.decode(worker.manager.recv_multipart()[1]))
    assert frames == [W.Replies([W.Started(f"c{i}", i + 1), W.Done(f"c{i}", i + 1, 0)])
                      for i in range(3)]


def test_aborts_in_a_row_take_out_theirs_and_leave_the_rest_in_order(executor_for) -> None:
    """Aborts in a row, each naming several prompts: the waiting and running ones named go
    (an unknown id is passed over), the rest keep their order, and a request sent between two
    aborts is in the queue in its place (the aborts before it taken out first, those after it
    at the drain's end)."""
    with worker_on(executor_for, "aborting-worker") as worker:
        engine = worker.adapters.engine
        worker.send(asked("running", 1000, prompt_ids=[5, 6, 7]))
        worker.receive()
        engine.step()
        assert [seq.request.id for seq in engine.running] == ["running"]
        for i in range(8):
            worker.send(asked(f"p{i}", prompt_ids=[5, 6, 7]))
        worker.receive()
        for message in (W.Abort(["p1", "p3"]), W.Abort(["running", "nothing"]),
                        asked("late", prompt_ids=[8, 9]), W.Abort(["p5", "p7"])):
            worker.send(message)
        worker.receive()
        assert [r.id for r in engine.waiting] == ["p0", "p2", "p4", "p6", "late"]
        assert not engine.running


def test_a_burst_of_requests_comes_in_between_the_steps_of_those_decoding(executor_for) -> None:
    """1,000 requests in one frame (as a 1,000-input request's prompts come, ~0.1 ms each to
    take in): one drain takes them all while nothing decodes and none is owed a first token
    (embeddings), but only what `DRAIN_S` allows beside a sequence that decodes, which gets
    its next token before the rest come in, in their order, over the drains that follow; an
    abort reaches those not taken yet."""
    burst = [asked(f"e{i}", 1, prompt=f"input {i} of a long request") for i in range(1000)]
    embeddings = [W.Generate(f"v{i}", "acme", MODEL, W.SamplingParams(max_tokens=0, embed=True),
                             prompt=f"input {i} of a long request") for i in range(1000)]
    with worker_on(executor_for, "burst-worker") as worker:
        engine = worker.adapters.engine
        worker.send(W.Generates(embeddings))
        worker.receive()
        assert len(engine.waiting) == len(embeddings)
        engine.abort({m.id for m in embeddings})
        worker.send(W.Generates(burst))
        worker.receive()  # none decodes, but the first of them is owed its first token
        assert 0 < len(engine.waiting) < len(burst)
        engine.abort({m.id for m in burst})
        worker.intake.drop({m.id for m in burst})
        worker.send(asked("decoding", 1000, prompt_ids=[5, 6, 7]))
        worker.receive()
        engine.step()
        worker.send(W.Generates(burst))
        worker.receive()
        assert 0 < len(engine.waiting) < len(burst) == len(engine.waiting) + len(worker.intake)
        assert [seq.request.id for seq in engine.running] == ["decoding"]
        generated = engine.running[0].generated
        engine.step()
        assert engine.running[0].generated == generated + 1
        queued = [r.id for r in engine.waiting] + [m.id for m in worker.intake]
        aborted = {m.id for m in burst[-100:]}
        worker.send(W.Abort(sorted(aborted)))
        drains = 0
        while worker.intake:
            worker.receive()
            drains += 1
        assert drains > 1  # still `DRAIN_S` a drain
        assert [r.id for r in engine.waiting] == [i for i in queued if i not in aborted]
        assert aborted <= set(queued)


def test_a_chat_behind_a_burst_of_embeddings_is_taken_next_and_waits_one_drain(
        executor_for) -> None:
    """With nothing decoding, a drain of embeddings alone takes them all (the step after it is
    as full as can be); a chat that comes behind 2,000 of them (another API request) is taken
    next, and from then on the drain ends within `DRAIN_S`: its first token waits for one
    step, not for the rest to come in."""
    burst = [W.Generate(f"e{i}", "acme", MODEL, W.SamplingParams(max_tokens=0, embed=True),
                        prompt=f"input {i} of a long request", group="big") for i in range(2000)]
    with worker_on(executor_for, "chat-behind-worker") as worker:
        engine = worker.adapters.engine
        worker.send(W.Generates(burst))
        worker.send(asked("chat", 4, prompt="Hello there", group="chat"))
        worker.receive()
        assert "chat" in [r.id for r in engine.waiting]
        assert len(worker.intake) > len(burst) // 2
        assert len(engine.waiting) + len(worker.intake) == len(burst) + 1
