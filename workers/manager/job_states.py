"""A fine-tuning job's state machine: the statuses and the moves between them. Every change of
a job's status goes through `JobStore.move`, which applies this table atomically.

    validating_files -> queued | failed | cancelled
    queued  -> running (a trainer claims it) | paused | cancelled | failed
    running -> succeeded | failed | cancelled | paused | queued (requeued after a crash)
    paused  -> queued (resume) | cancelled
    succeeded, failed, cancelled: final
"""

from __future__ import annotations

from wire.jobs import TERMINAL

STATUSES = ("validating_files", "queued", "running", "paused", *TERMINAL)
MOVES: dict[str, frozenset[str]] = {
    "validating_files": frozenset({"queued", "failed", "cancelled"}),
    "queued": frozenset({"running", "paused", "cancelled", "failed"}),
    "running": frozenset({"succeeded", "failed", "cancelled", "paused", "queued"}),
    "paused": frozenset({"queued", "cancelled"}),
    **{status: frozenset() for status in TERMINAL},
}


class IllegalMove(ValueError):
    pass


def can_move(current: str, target: str) -> bool:
    return target in MOVES.get(current, ())


def sources(target: str) -> tuple[str, ...]:
    """The statuses a job may move to `target` from."""
    if target not in MOVES:
        raise IllegalMove(f"unknown status {target!r}")
    return tuple(s for s in STATUSES if target in MOVES[s])
