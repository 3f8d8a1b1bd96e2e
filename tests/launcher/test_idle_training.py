"""The stack gives the jobs the idle twin by default exactly where the executor can fork one."""

from __future__ import annotations

import pydantic
import pytest

from executor.config import ExecutorConfig
from launcher.idle_training import idle_training


def forks_a_twin(device: str, shards: int) -> bool:  # the executor's own rule
    try:
        ExecutorConfig(model="tiny-llama", device=device, shards=shards, idle_twin="ipc:///t")
    except pydantic.ValidationError:
        return False
    return True


@pytest.mark.parametrize(("device", "shards"), [("cpu", 1), ("cpu", 2), ("cuda", 1),
                                                ("cuda:1", 1), ("cuda", 4)])
def test_unset_it_is_on_wherever_the_executor_forks_a_twin(device, shards) -> None:
    expected = forks_a_twin(device, shards)
    assert idle_training({"SYMBIOSIS_EXECUTOR_DEVICE": device,
                          "SYMBIOSIS_EXECUTOR_SHARDS": str(shards)}) is expected
    assert idle_training({}, ("--device", device, f"--shards={shards}")) is expected
    assert idle_training({"SYMBIOSIS_IDLE_TRAINING": ""}, ("--device", device, "--shards",
                                                           str(shards))) is expected


def test_the_flags_win_over_the_settings_and_a_choice_over_both() -> None:
    assert idle_training({}) is True  # a CPU executor of one shard: the defaults
    gpu = {"SYMBIOSIS_EXECUTOR_DEVICE": "cuda"}
    assert idle_training(gpu) is False
    assert idle_training(gpu, ("--device", "cpu")) is True
    assert idle_training({}, ("--shards", "2", "--shards", "1")) is True  # the last one
    assert idle_training({"SYMBIOSIS_IDLE_TRAINING": "false"}) is False
    assert idle_training({"SYMBIOSIS_IDLE_TRAINING": "No"}) is False
    assert idle_training({**gpu, "SYMBIOSIS_IDLE_TRAINING": "yes"}) is True  # refused there
