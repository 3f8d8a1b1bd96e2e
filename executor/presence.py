"""What the scheduler knows of each client between its calls: when it was last seen and served,
whether it has a call queued, where it called last, and how long it usually takes from a reply
to its next call at each layer. Clients walk the model's layers in the same order, so the layer
that followed a layer before (`successor`) predicts where an idle client will call next."""

from __future__ import annotations

from dataclasses import dataclass, field

from executor.calls import PendingCall
from executor.lanes import Lane
from wire.call.messages import CallKind, Op

Key = tuple[int, Op]
GAP_SMOOTHING = 0.2
DUE_SLACK_S = 200e-6
PAUSE_S = 0.05  # a longer gap from a reply to the next call is a pause (between requests)
AWAY_GAPS = 4  # away this many times its longest usual gap (and PAUSE_S): pausing
LATELY_PASSES = 2  # a key called within this many of a client's passes is on its way (`lately`)


@dataclass
class Presence:
    last_seen: float
    last_key: Key | None = None
    queued: int = 0
    inference: bool = False  # its last call was an inference call
    decode: bool = False  # its last call was a decode step
    served: float = 0.0  # when its last batch finished (0: never)
    gaps: dict[Key, float] = field(default_factory=dict)  # served -> next call here, smoothed
    route: dict[Key, int] = field(default_factory=dict)  # where it called: its latest call's no.
    calls: int = 0  # its calls so far (their numbers)
    pass_calls: int = 0  # calls from its one before at a key to its latest there (0: no repeat)
    _trains: set[int] | None = field(default=None, repr=False)  # of its calls so far

    def arrive(self, call: PendingCall, successor: dict[Key, Key]) -> None:
        """A call of this client was queued."""
        if self.last_key is not None and self.last_key != call.key:
            successor[self.last_key] = call.key
        gap = call.arrived - self.served
        if self.served and not self.queued and gap < PAUSE_S:
            old = self.gaps.get(call.key)
            self.gaps[call.key] = gap if old is None else old + GAP_SMOOTHING * (gap - old)
        self.last_seen, self.last_key = call.arrived, call.key
        self.calls += 1
        before = self.route.get(call.key)
        if before is not None and before < self.calls - 1:
            self.pass_calls = self.calls - before
        self.route[call.key] = self.calls
        self._trains = None
        self.inference = call.kind == CallKind.INFERENCE
        self.decode = call.lane == Lane.DECODE
        self.queued += 1

    def lately(self) -> set[Key]:
        """Where it called within its last `LATELY_PASSES` passes (everywhere it called, before it
        came back to a key): where its steps call now. The keys of an evaluation it made an epoch
        ago, or of a shorter last batch, fall out of it once it has walked its steps since."""
        since = self._lately_since()
        return {key for key, at in self.route.items() if at > since}

    def called_lately(self, key: Key) -> bool:
        """`key in self.lately()`, without building the set (the convoys ask it on every scan)."""
        at = self.route.get(key)
        return at is not None and at > self._lately_since()

    def _lately_since(self) -> int:
        return self.calls - LATELY_PASSES * self.pass_calls if self.pass_calls else 0

    def trains(self) -> set[int]:
        """The layers of its backward calls lately: where a job's steps train (its shape); kept
        until its next call (the training convoy asks it of every active peer on each scan)."""
        if self._trains is None:
            self._trains = {layer for layer, op in self.lately() if op == Op.BACKWARD}
        return self._trains

    def active(self, now: float, window_s: float) -> bool:
        """Whether it called within the last `window_s` (and has not departed since)."""
        return now - self.last_seen <= window_s

    def pausing(self, now: float) -> bool:
        """Whether it has stayed away since its last reply longer than `PAUSE_S` and `AWAY_GAPS`
        times the longest of its usual gaps (a trainer saving a checkpoint, say): not coming
        back soon. Never before a gap was learned (one whose own work between calls always
        takes longer than `PAUSE_S` is never counted as pausing)."""
        if not self.served or self.queued or not self.gaps:
            return False
        return now - self.served > max(PAUSE_S, AWAY_GAPS * max(self.gaps.values()))

    def depart(self) -> None:
        """It said goodbye or hung up: neither active nor due from now on; forgotten once
        nothing of it is queued (`forget_departed`)."""
        self.last_seen, self.served = float("-inf"), 0.0


def convoy(presence: dict[bytes, Presence], successor: dict[Key, Key],
           positions: dict[int, int], now: float, active_window_s: float,
           longest_gap_s: float) -> tuple[list[tuple[bytes, int]], dict[Key, float]]:
    """Whom a decode step waits for: the active decode clients with a forward call queued, with
    its position in the pass (served first, farthest behind first, they come next); and for
    each layer, until when an idle decode client may still come there (one whose last call led
    there before, for twice its usual gap from a reply to that call, if that gap is no longer
    than `longest_gap_s`: a longer one is a pause, as between requests, not a step)."""
    behind: list[tuple[bytes, int]] = []
    due: dict[Key, float] = {}
    for client, p in presence.items():
        if not p.decode or p.last_key is None or p.last_key[1] == Op.BACKWARD:
            continue
        if p.queued:
            if p.active(now, active_window_s):
                behind.append((client, positions.get(p.last_key[0], p.last_key[0])))
        elif p.served and (key := successor.get(p.last_key)) is not None \
                and (gap := p.gaps.get(key)) is not None and gap <= longest_gap_s:
            due[key] = max(due.get(key, 0.0), p.served + 2 * gap + DUE_SLACK_S)
    return behind, due


def forget_departed(presence: dict[bytes, Presence], now: float, idle_s: float = 60.0) -> None:
    """Drop clients with nothing queued, unseen for `idle_s` (or departed: `Scheduler.depart`)."""
    for client in [c for c, p in presence.items() if p.queued == 0 and now - p.last_seen > idle_s]:
        del presence[client]
