"""What the scheduler learns of a client between calls: successors, gaps (pauses left out),
when it is pausing, where it calls and trains, and whom a decode step's convoy waits for."""

from __future__ import annotations

import pytest
import torch

from executor.calls import PendingCall
from executor.presence import AWAY_GAPS, DUE_SLACK_S, GAP_SMOOTHING, PAUSE_S, Presence, convoy
from wire.call.messages import Call, CallKind, Op


def pending(layer: int, at: float, rows: int = 1, op: Op = Op.FORWARD,
            kind: CallKind = CallKind.INFERENCE) -> PendingCall:
    return PendingCall(b"c", Call(0, op, layer, kind, "float32", (rows, 1)),
                       torch.empty(rows, 1), at)


def test_gaps_are_smoothed_per_layer_and_pauses_are_not_learned() -> None:
    me, successor = Presence(0.0), {}
    me.arrive(pending(0, 0.0), successor)
    me.queued, me.served = 0, 0.001
    me.arrive(pending(1, 0.003), successor)  # 2 ms after its reply
    assert successor == {(0, Op.FORWARD): (1, Op.FORWARD)}
    assert me.gaps == {(1, Op.FORWARD): pytest.approx(0.002)}
    me.queued, me.served = 0, 0.004
    me.arrive(pending(1, 0.008), successor)  # 4 ms
    assert me.gaps[(1, Op.FORWARD)] == pytest.approx(0.002 + GAP_SMOOTHING * 0.002)
    learned = dict(me.gaps)
    me.queued, me.served = 0, 0.010
    me.arrive(pending(1, 1.010), successor)  # a second later: a pause between requests
    assert me.gaps == learned
    me.served = 1.011
    me.arrive(pending(1, 1.012), successor)  # still queued: no gap from a reply
    assert me.gaps == learned and me.queued == 2


def test_route_holds_every_key_called_and_trains_the_layers_of_backward_calls() -> None:
    me, successor = Presence(0.0), {}
    for layer, op in ((0, Op.FORWARD), (1, Op.FORWARD), (1, Op.BACKWARD), (2, Op.FORWARD)):
        me.arrive(pending(layer, 0.0, op=op, kind=CallKind.TRAINING), successor)
    assert me.route == {(0, Op.FORWARD): 1, (1, Op.FORWARD): 2, (1, Op.BACKWARD): 3,
                        (2, Op.FORWARD): 4}
    assert me.pass_calls == 0 and me.lately() == set(me.route)  # no pass walked yet: all
    assert me.trains() == {1}


def test_lately_keeps_the_keys_of_its_last_two_passes() -> None:
    me, successor = Presence(0.0), {}
    step = ((1, Op.FORWARD), (1, Op.BACKWARD), (9, Op.FORWARD))  # 9: the head's loss, say
    for layer, op in (*step, (4, Op.FORWARD), (4, Op.FORWARD), *step):  # an evaluation between
        me.arrive(pending(layer, 0.0, op=op, kind=CallKind.TRAINING), successor)
    # its step came back to each key 5 calls on (the second call at 4, right after the first,
    assert me.pass_calls == 5  # is no pass)
    assert (4, Op.FORWARD) in me.lately() and me.called_lately((4, Op.FORWARD))
    assert not me.called_lately((7, Op.FORWARD))  # never called there (2 passes reach back
    # before its first call)
    for _ in range(3):
        for layer, op in step:
            me.arrive(pending(layer, 0.0, op=op, kind=CallKind.TRAINING), successor)
    assert me.pass_calls == 3 and me.lately() == set(step)  # the evaluation 4 passes ago: out
    assert {key for key in me.route if me.called_lately(key)} == me.lately()  # asked key by key
    assert not me.called_lately((7, Op.FORWARD))  # never called there
    for layer, op in ((1, Op.FORWARD), (2, Op.FORWARD), (2, Op.BACKWARD), (1, Op.BACKWARD),
                      (9, Op.FORWARD)):  # a last, shorter batch trains through 2 as well
        me.arrive(pending(layer, 0.0, op=op, kind=CallKind.TRAINING), successor)
    assert me.trains() == {1, 2}
    for _ in range(3):
        for layer, op in step:
            me.arrive(pending(layer, 0.0, op=op, kind=CallKind.TRAINING), successor)
    assert me.trains() == {1}


def test_a_client_pauses_once_away_past_pause_s_and_its_longest_gaps() -> None:
    me, successor = Presence(0.0), {}
    me.arrive(pending(0, 0.0, kind=CallKind.TRAINING), successor)
    me.queued, me.served = 0, 0.001
    assert not me.pausing(10.0)  # no gap learned yet: its own work may always take this long
    me.arrive(pending(1, 0.003, kind=CallKind.TRAINING), successor)  # 2 ms after its reply
    assert me.pausing(10.0) is False  # queued
    me.queued, me.served = 0, 0.004
    assert not me.pausing(0.004 + PAUSE_S) and me.pausing(0.004 + PAUSE_S + 1e-6)
    me.arrive(pending(0, 0.004 + 0.040, kind=CallKind.TRAINING), successor)  # 40 ms: learned
    me.queued, me.served = 0, 0.050
    away = AWAY_GAPS * max(me.gaps.values())
    assert away == pytest.approx(AWAY_GAPS * 0.040) and away > PAUSE_S  # the longest gap's now
    assert not me.pausing(0.050 + away - 1e-6) and me.pausing(0.050 + away + 1e-6)


def test_convoy_lists_queued_decode_clients_and_when_idle_ones_are_due() -> None:
    successor = {(0, Op.FORWARD): (1, Op.FORWARD)}
    queued = Presence(9.9, last_key=(3, Op.FORWARD), queued=1, decode=True)
    idle = Presence(9.9, last_key=(0, Op.FORWARD), decode=True, served=9.99,
                    gaps={(1, Op.FORWARD): 0.002})
    slow = Presence(9.9, last_key=(0, Op.FORWARD), decode=True, served=9.99,
                    gaps={(1, Op.FORWARD): 0.5})  # its usual gap is longer than we wait
    prefill = Presence(9.9, last_key=(2, Op.FORWARD), queued=1, decode=False)
    trainer = Presence(9.9, last_key=(2, Op.BACKWARD), queued=1, decode=True)
    gone = Presence(1.0, last_key=(2, Op.FORWARD), queued=1, decode=True)
    presence = {b"q": queued, b"i": idle, b"s": slow, b"p": prefill, b"t": trainer, b"g": gone}
    behind, due = convoy(presence, successor, {3: 30}, now=10.0, active_window_s=0.5,
                         longest_gap_s=0.02)
    assert behind == [(b"q", 30)]  # by position in the pass
    assert due == {(1, Op.FORWARD): pytest.approx(9.99 + 0.004 + DUE_SLACK_S)}
