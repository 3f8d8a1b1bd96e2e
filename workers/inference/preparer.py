"""A request's prompt tokenized and its output constraint compiled by a thread of the worker's
own, so that one long prompt (2 MB take the tokenizer seconds) or one large schema (llguidance
half a second) never holds up the decode steps of the other requests the worker runs: both let
go of the GIL while they work. The worker's loop hands each `heavy` Generate in (`submit`; the
others it prepares itself) and takes them back prepared, in the order they came (`ready`);
`wake` turns readable as one is ready, so the loop's poll sees it."""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from wire import manager as W
from workers.inference.checks import grammar_refused
from workers.inference.grammar import GrammarError, Grammars
from workers.inference.prompt import prompt_ids

log = logging.getLogger("workers.preparer")

# a prompt's text and a constraint's grammar up to this long are prepared in the worker's loop:
# their few milliseconds cost less than a hand-over, after which a request waits for the
# engines' next step or two (tens of ms beside busy engines) to join; past it, tokenizing runs
# ~1.4 MB/s here and a grammar's compile grows with its schema (0.5 s for 600 KB)
INLINE_CHARS = 16_384


def heavy(message: W.Generate) -> bool:
    """Whether preparing it may take long enough to hold up the other requests' steps."""
    text = len(message.prompt or "") + sum(len(m.content) for m in message.messages or ())
    return max(text, len(message.params.grammar or "")) > INLINE_CHARS


@dataclass
class Prepared:
    message: W.Generate
    ids: list[int] | None = None
    matcher: Any = None  # its output constraint's, compiled (None: none, or left to the engine)
    failed: W.Failed | None = None


def prepare(message: W.Generate, tokenizer: Any, max_context: int,
            grammars: Grammars | None = None) -> Prepared:
    """Its prompt's ids, and with `grammars` its constraint compiled; else why it fails."""
    try:
        limit = min(max_context, message.max_context or max_context)
        ids = prompt_ids(message, tokenizer, limit)
    except Exception as exc:
        return Prepared(message, failed=W.Failed(message.id, 400, "invalid_prompt", str(exc)))
    grammar = message.params.grammar
    if grammars is None or grammar is None or message.params.count:
        return Prepared(message, ids)
    try:
        return Prepared(message, ids, grammars.matcher(grammar))
    except GrammarError as exc:
        return Prepared(message, failed=grammar_refused(message.id, exc))


class Preparer:
    def __init__(self, ctx: zmq.Context, prepared: Callable[[W.Generate], Prepared]) -> None:
        self.prepared = prepared
        name = f"inproc://prepared-{uuid.uuid4().hex}"
        self.wake = ctx.socket(zmq.PULL)  # the loop's
        self.wake.bind(name)
        self._bell = ctx.socket(zmq.PUSH)  # the thread's alone from here on
        self._bell.connect(name)
        self._asked: queue.SimpleQueue[W.Generate | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[Prepared] = queue.SimpleQueue()
        self._pending: set[str] = set()
        self._dropped: set[str] = set()
        self._poller: zmq.Poller | None = None
        self._thread = threading.Thread(target=self._run, name="preparer", daemon=True)
        self._thread.start()

    def poller(self, sock: zmq.Socket) -> zmq.Poller:
        """A poll of `sock` (the worker's) and of `wake`, made once."""
        if self._poller is None:
            self._poller = zmq.Poller()
            for socket in (sock, self.wake):
                self._poller.register(socket, zmq.POLLIN)
        return self._poller

    def submit(self, message: W.Generate) -> None:
        self._pending.add(message.id)
        self._asked.put(message)

    def drop(self, request_id: str) -> None:
        """An abort of a request not yet prepared: it never reaches an engine."""
        if request_id in self._pending:
            self._dropped.add(request_id)

    def ready(self) -> list[Prepared]:
        """Those prepared since last asked, but the dropped."""
        while True:
            try:
                self.wake.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        done = []
        while True:
            try:
                made = self._done.get_nowait()
            except queue.Empty:
                return done
            self._pending.discard(made.message.id)
            if made.message.id in self._dropped:
                self._dropped.discard(made.message.id)
            else:
                done.append(made)

    def close(self) -> None:
        self._asked.put(None)
        self._thread.join(10)
        self._bell.close(0)
        self.wake.close(0)

    def _run(self) -> None:
        while (message := self._asked.get()) is not None:
            try:
                made = self.prepared(message)
            except Exception as exc:  # a bug fails its request, never the thread (and the rest)
                log.exception("preparing request %s failed", message.id)
                made = Prepared(message, failed=W.Failed(message.id, 500, "internal_error",
                                                         type(exc).__name__))
            self._done.put(made)
            self._bell.send(b"")
