"""The trial that decides whether greedy calls pay: steps alternate while it probes, the way
with the shorter median step is kept, then it probes again; interrupted steps are no samples."""

from __future__ import annotations

from workers.remote.trial import Trial


class Steps:
    """A clock that advances by each step's duration: `with_s` after a step that took the way,
    `without_s` after one that did not."""

    def __init__(self, with_s: float, without_s: float) -> None:
        self.now, self.with_s, self.without_s = 0.0, with_s, without_s

    def run(self, trial: Trial, steps: int) -> list[bool]:
        taken = []
        for _ in range(steps):
            took = trial.step()
            taken.append(took)
            self.now += self.with_s if took else self.without_s
        return taken

    def __call__(self) -> float:
        return self.now


def test_the_faster_way_is_kept_after_probing_and_measured_again_later() -> None:
    for with_s, without_s, kept in ((2.0, 3.0, True), (3.0, 2.0, False)):
        clock = Steps(with_s, without_s)
        trial = Trial(clock, probe=8, keep=20)
        probing = clock.run(trial, 8)
        assert probing == [True, False] * 4  # alternately, the way first
        assert clock.run(trial, 21) == [kept] * 21
        assert not trial.probing
        clock.with_s, clock.without_s = clock.without_s, clock.with_s  # the host changed
        assert clock.run(trial, 8) == [not kept, kept] * 4  # probing again
        assert clock.run(trial, 21) == [not kept] * 21


def test_a_few_long_steps_do_not_decide() -> None:
    """A pause between requests makes one step long: the medians stand."""
    clock = Steps(2.0, 3.0)
    trial = Trial(clock, probe=8, keep=20)
    for i in range(8):
        trial.step()
        clock.now += (2.0 if i % 2 == 0 else 3.0) + (50.0 if i == 2 else 0.0)
    assert clock.run(trial, 5) == [True] * 5


def test_interrupted_steps_are_no_samples_and_fixed_ways_are_not_measured() -> None:
    clock = Steps(2.0, 3.0)
    trial = Trial(clock, probe=8, keep=20)
    for _ in range(8):  # every step interrupted (a new batch each time): nothing measured
        trial.step()
        clock.now += 100.0
        trial.interrupt()
    assert trial.probing and trial.samples == ([], [])
    clock.run(trial, 9)
    assert clock.run(trial, 3) == [True] * 3
    trial.fixed = False
    assert clock.run(trial, 40) == [False] * 40
