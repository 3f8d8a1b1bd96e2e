"""The executor's settings: flags over environment over defaults, and what is refused."""

from __future__ import annotations

import pytest

from catalogue.resolve import resolve_model
from executor.__main__ import parse_args
from executor.config import ExecutorConfig
from executor.registry import LayerRegistry
from executor.scheduling import build_scheduler


def test_flags_override_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("SYMBIOSIS_EXECUTOR_SLICE_MS", "2.5")
    monkeypatch.setenv("SYMBIOSIS_EXECUTOR_TRAINING_SHARE", "0.4")
    monkeypatch.setenv("SYMBIOSIS_EXECUTOR_POLICY", "eager")
    config = parse_args(["--policy", "opportunistic"])
    assert (config.slice_ms, config.training_share, config.policy) == (2.5, 0.4, "opportunistic")
    assert parse_args(["--slice-ms", "0"]).slice_ms == 0.0


def test_the_scheduler_gets_the_slice_and_the_share() -> None:
    registry = LayerRegistry.load(resolve_model("tiny-llama"))
    scheduler = build_scheduler(ExecutorConfig(slice_ms=2.0, training_share=0.3), registry)
    assert scheduler.policy.slice_s == pytest.approx(0.002)
    assert scheduler.training_share_now() == (0.0, 0.3, None, 0)  # nothing ran yet; no twin
    targeted = build_scheduler(ExecutorConfig(decode_target_ms=3.0, prefill_target_ms=40.0),
                               registry)
    assert targeted.training_slice_s() == pytest.approx(0.003)  # it starts at the target
    assert (targeted.targets.decode_s, targeted.targets.prefill_s) == (0.003, 0.04)
    assert build_scheduler(ExecutorConfig(slice_ms=0), registry).training_slice_s() is None


@pytest.mark.parametrize("bad", [{"slice_ms": -1.0}, {"training_share": 1.0},
                                 {"policy": "fifo"}, {"bind": "http://x"}])
def test_bad_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        ExecutorConfig(**bad)
