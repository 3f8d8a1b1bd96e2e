"""How long each queue of calls should still wait before its batch may run (the scheduler's
scan), and how long training yields to decode steps about to come (`training_holds`, which the
scan and `Scheduler.hold_training` apply).

A queue at `max_batch_rows` is ready; a queue of decode steps waits for its convoy (up to the
policy's `convoy_s`, or the shortest wait a call's tenants allow, but not shorter than a batch of
its own would cost) while a decode client that called at its layer lately (`Presence.lately`)
is queued earlier in the pass or an idle one is due here (`executor.presence.convoy`; a tenant
whose adapter keeps it off the stretches takes the projections instead, and never comes to a
stretch's queue, nor, two passes on, does one whose adapters moved it off them); a queue of
training calls waits likewise, up to `convoy_s` after its first call came, while an active
trainer of the same shape (`Presence.trains`) that calls at its layer is neither in it nor
queued elsewhere (`_trainers_to_come`) and no inference client is active (`_trainers_only`);
else the policy decides, up to the queue's deadline (which a call's target caps too), from the
clients that may still join it.

Training's convoy: trainers run the same sequence of calls and drift apart, and a call waited
only for a trainer whose very next call was due at its layer, so 8 jobs of 1 x 32 steps on
llama-160m ran 3.5 calls a batch, the executor computing 2.9 ms a token; waiting for every
trainer, 7.7 calls a batch and 1.9 ms a token: 334 against 305 tok/s, the executor's compute
3.9 against 5.3 s in a 6 s window (2-core Xeon, bench NOTES; a lone job never waits: its trainer
is queued wherever its call is). A trainer computing its own part keeps the others waiting no
longer than `convoy_s` a call; one away past its usual gaps (`Presence.pausing`: a checkpoint
being saved) not at all, though it counts as active for `active_window_s` after its last call.
From `TRAINING_CONVOY_ROWS` rows a batch waits for no one: its products run near their best
rate already (12 kept llama-160m stretches: 3.0 ms a row at 32 rows, 1.55 at 128, 1.3 at 256),
and waiting only left the executor idle while trainers computed (8 jobs of 2 x 128 steps in
convoy: 387-395 against 406-407 tok/s).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from executor.calls import PendingCall
from executor.lanes import Lane, lane_of_batch
from executor.presence import Key, convoy
from wire.call.messages import Op

TRAINING_CONVOY_ROWS = 256  # a training batch of this many rows waits for no more trainers

if TYPE_CHECKING:
    from executor.scheduler import Scheduler


def queue_waits(s: Scheduler, now: float) -> Iterator[tuple[deque[PendingCall], float]]:
    """Each non-empty queue of `s` with the seconds it should still wait (<= 0: ready)."""
    convoy_s = s.policy.convoy_s
    active: set[bytes] | None = None  # clients seen lately, computed when first needed
    queued: set[bytes] = set()  # those of them with a call queued, likewise
    waits_for: tuple[list[tuple[bytes, int]], dict[Key, float]] | None = None  # likewise
    for key, queue in s.busy.items():
        if len(queue) == 1:
            call = queue[0]
            calls, deadline, rows = [call], call.deadline, call.rows
        else:
            calls = list(queue)
            deadline = min(c.deadline for c in calls)
            rows = sum(c.rows for c in calls)
        if rows >= s.max_batch_rows:
            yield queue, 0.0
            continue
        if now < calls[0].arrived + convoy_s and key[1] != Op.BACKWARD \
                and all(c.lane == Lane.DECODE for c in calls) \
                and now < (convoy_until := _convoy_until(calls, convoy_s,
                                                         s.cost.decode_batch_s(key))):
            if waits_for is None:
                waits_for = convoy(s.presence, s.successor, s.positions, now,
                                   s.active_window_s, convoy_s)
            behind, due = waits_for
            position = s.positions.get(key[0], key[0])
            here = {c.client for c in calls}
            if any(at < position and client not in here and s.presence[client].called_lately(key)
                   for client, at in behind):
                yield queue, convoy_until - now
                continue
            if due.get(key, 0.0) > now:
                yield queue, min(due[key], convoy_until) - now
                continue
        convoying = now < calls[0].arrived + convoy_s and rows < TRAINING_CONVOY_ROWS \
            and lane_of_batch(calls) == Lane.TRAINING
        if now >= deadline and not convoying:  # past its deadline: ready
            yield queue, 0.0
            continue
        if active is None:
            active = {c for c, p in s.presence.items() if p.active(now, s.active_window_s)}
            queued = {c for c in active if s.presence[c].queued}
        settled = {c.client for c in calls} | queued
        if convoying and _trainers_only(s, active) \
                and _trainers_to_come(s, key, calls[0].client, active, settled, now):
            yield queue, calls[0].arrived + convoy_s - now
        elif now >= deadline or s.policy.ready(calls, now, deadline, _joiners(s, key, active),
                                               settled, active):
            yield queue, 0.0
        else:
            yield queue, deadline - now


def _convoy_until(calls: list[PendingCall], convoy_s: float, apart_s: float) -> float:
    """Until when decode steps wait for their convoy: `convoy_s` after the first came, or sooner
    where a call's tenants asked for a shorter wait (`PendingCall.target_s`), but never shorter
    than `apart_s`, what a batch of its own would cost: run apart, a step makes the executor,
    which every step (its own next ones too) waits for, read the layer's weights once more; on
    a busy host that cost everyone more than the convoy's wait (bench 6c)."""
    until = calls[0].arrived + convoy_s
    for c in calls:
        if c.target_s is not None:
            until = min(until, c.arrived + max(c.target_s, apart_s))
    return until


def _joiners(s: Scheduler, key: Key, active: set[bytes]) -> Iterator[bytes]:
    """Active clients with nothing queued whose next call is expected at `key`."""
    for client in active:
        p = s.presence[client]
        if p.queued == 0 and p.last_key is not None and s.successor.get(p.last_key) == key:
            yield client


def _trainers_only(s: Scheduler, active: set[bytes]) -> bool:
    """Whether no active client is an inference client. Beside tenants the convoy cost them (the
    Azure trace + 2 jobs, convoy beside it: time to first token p99 1.29x / 1.78x / 1.14x of the
    trace alone, against 0.85-1.29x in twelve runs before). Not traced; a likely cause is the
    share (`executor.share`), which counts a training call waiting for its convoy as training
    held back and so favours training over the tenants next."""
    return not any(s.presence[c].inference for c in active)


def _trainers_to_come(s: Scheduler, key: Key, waiting: bytes, active: set[bytes],
                      settled: set[bytes], now: float) -> bool:
    """Whether an active client whose last call was a training call, which has called at `key`
    lately (`Presence.lately`: within its last two passes) and trains through every layer the
    trainer `waiting` trains through lately (`Presence.trains`: a job of the same shape), has
    none queued now and is not pausing: it computes its own part and comes back (to this queue,
    if it is behind). A job of another shape would not come soon, if at all: a 1 x 32 job's
    steps take the kept stretches, a 2 x 128 job's the projections, and both the head's loss;
    waiting for the other gave the small job 38-41 tok/s against 87-89 without the convoy
    (2-core Xeon, bench NOTES). The layers an evaluation's forward takes (a stretch without its
    kept twin, the greedy steps of a held-out prompt) say nothing of a job's shape, and a peer
    that has not called there lately is not coming in its step: an evaluation's call waits for
    no such peer (each waited up to `convoy_s`), nor, once a job's last short batch is passes
    behind it, does the job's next step wait only for peers that trained through that batch's
    layers too."""
    mine = s.presence[waiting].trains()
    return any(not (p := s.presence[c]).inference and p.called_lately(key) and p.trains() >= mine
               and not p.pausing(now) for c in active - settled)


def training_holds(s: Scheduler, now: float, convoy_until: float) -> float:
    """Seconds a training batch (or its next slice) should leave the executor idle for a decode
    step about to come: one queued for its convoy (until `convoy_until`), or an idle decode
    client due soon (`presence.convoy`); never longer than `convoy_s`, and only while training
    keeps its share. A slice started in such a gap is what a decode step waited for."""
    return decode_holds(s, now, convoy_until) if s.share.kept() else 0.0


def held_waits(s: Scheduler, now: float, convoy_until: float,
               held: list[tuple[deque[PendingCall], float, Lane]]
               ) -> Iterator[tuple[deque[PendingCall], float]]:
    """The waits of queues of training calls and of flex requests' calls (`held`: each with
    its wait so far and its lane): training's held while decode steps are due and it keeps its
    share (`training_holds`), or while the serving executor holds the idle twin
    (`share.held`); flex requests' while decode steps are due, whatever training's share (the
    scan holds them up to starving), so that a batch's calls, and the host's cores its workers
    would take meanwhile, do not come before an interactive tenant's next token."""
    holds: dict[Lane, float] = {}
    for queue, wait, lane in held:
        if lane not in holds:
            holds[lane] = decode_holds(s, now, convoy_until) if lane == Lane.FLEX else \
                max(training_holds(s, now, convoy_until), s.share.held(now))
        yield queue, max(wait, holds[lane])


def decode_holds(s: Scheduler, now: float, convoy_until: float) -> float:
    """Seconds to leave the executor idle for a decode step about to come (`held_waits`)."""
    convoy_s = s.policy.convoy_s
    if convoy_s <= 0:
        return 0.0
    _, due = convoy(s.presence, s.successor, s.positions, now, s.active_window_s, convoy_s)
    return min(max(convoy_until, *due.values()) - now, convoy_s) if due \
        else min(convoy_until - now, convoy_s)
