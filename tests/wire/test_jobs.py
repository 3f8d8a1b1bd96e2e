"""Job control messages: statuses are an enum on the wire, the state machine's own."""

from __future__ import annotations

import msgspec
import pytest

from wire import manager as W
from wire.jobs import (
    JobAction,
    JobCommand,
    JobSpec,
    JobState,
    JobStatus,
    NewJob,
    PeftSpec,
    TrainerStopped,
)
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


def test_a_create_command_carries_the_typed_job_and_a_forged_spec_is_refused() -> None:
    new = NewJob(tenant="acme", model="tiny-llama", training_file="file-1", seed=7,
                 spec=JobSpec(3, 2, 0.5, PeftSpec(method="ia3", r=4)), metadata={"k": "v"},
                 priority=5)
    command = JobCommand("r", "ftjob-1", JobAction.CREATE, new)
    decoded = W.decode(W.encode(command))
    assert decoded == command and decoded.new.spec.peft.method == "ia3"
    assert W.decode(W.encode(JobState("r", "ftjob-1", JobStatus.PAUSED, False))).moved is False
    wire_form = msgspec.to_builtins(command)
    wire_form[4]["spec"]["n_epochs"] = "three"  # an int on the wire, or refused
    with pytest.raises(msgspec.ValidationError):
        W.decode(msgspec.msgpack.encode(wire_form))
