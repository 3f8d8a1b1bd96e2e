"""Job control messages: statuses are an enum on the wire, the state machine's own."""

from __future__ import annotations

import msgspec
import pytest

from wire import manager as W
from wire.jobs import JobState, JobStatus, TrainerStopped
from workers.manager.job_states import STATUSES


def test_the_wire_knows_exactly_the_state_machines_statuses() -> None:
    assert {s.value for s in JobStatus} == {*STATUSES, "unknown"}


def test_a_status_round_trips_and_an_unknown_one_is_refused() -> None:
    message = TrainerStopped("ftjob-1", JobStatus.PAUSED)
    assert W.decode(W.encode(message)) == message
    assert W.decode(W.encode(JobState("r", "ftjob-1", JobStatus.UNKNOWN))).status == "unknown"
    forged = msgspec.msgpack.encode(["trainer_stopped", "ftjob-1", "exploded"])
    with pytest.raises(msgspec.ValidationError):
        W.decode(forged)
