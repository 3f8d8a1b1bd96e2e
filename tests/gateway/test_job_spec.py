"""A job's settings, resolved once at the API edge when the job is created."""

from __future__ import annotations

import pytest

from gateway.job_spec import resolve, too_few_examples
from openapi.fine_tuning import Hyperparameters
from wire.jobs import JobSpec


def test_defaults_are_resolved_once_at_creation() -> None:
    spec = resolve(Hyperparameters(learning_rate_multiplier=2),
                   {"method": "ia3", "r": 4, "alpha": None, "max_seq_length": None}, 200, 512)
    assert (spec.n_epochs, spec.batch_size, spec.learning_rate_multiplier) == (3, 4, 2.0)
    assert spec.peft.method == "ia3" and spec.peft.alpha == 8
    assert spec.peft.learning_rate == pytest.approx(2e-3)  # ia3's base rate x the multiplier
    assert spec.peft.max_seq_length == 512  # the default 1024, capped by the context
    assert resolve(Hyperparameters(), {"learning_rate": 0.01}, 3, 0).peft.learning_rate == 0.01
    assert resolve(Hyperparameters(), {}, 1000, 0).batch_size == 8
    assert JobSpec.from_stored(spec.hyperparameters(), spec.peft_dict()) == spec
    assert too_few_examples(10) is None
    assert "9 example(s)" in too_few_examples(9)
