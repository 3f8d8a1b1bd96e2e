"""The benchmark harness's client groups: fresh processes and clients forked from the run's
preloaded parent give the same kind of result, each side runs in its own environment, and a
client that fails is reported at once."""

import time

import pytest

from bench.group import Group
from bench.scenarios.common import client
from bench.sides import environment
from bench.zygote import Zygote


def _decode(duration: float = 0.5) -> list[str]:
    return client("decode", side="plain", model="tiny-llama", duration=duration, tokens=2)


@pytest.fixture(scope="module")
def zygote():
    parent = Zygote(environment("plain"))
    yield parent
    parent.close()
    assert parent.proc.returncode == 0


def test_forked_and_fresh_clients_measure_the_same_workload(zygote) -> None:
    forked = Group([_decode(), _decode()], forked=True, zygote=zygote).run()
    fresh = Group([_decode()], forked=False).run()
    for result in (forked, fresh):
        assert all(r["kind"] == "decode" and len(r["latencies"]) >= 2 for r in result.results)
        assert result.tokens_per_s() > 0 and result.peak_pss > 0
    assert len(forked.results) == 2


def test_plain_clients_run_at_openmps_defaults_and_ours_as_the_stack_sets_it(zygote) -> None:
    """Plain processes as a user runs them (OpenMP's idle threads spin a while), ours as the
    stack runs its workers (they sleep): forced on one 2-thread plain process, ours' setting
    made it 14-19 % slower (bench NOTES)."""
    forked = Group([_decode()], forked=True, zygote=zygote, side="plain").run()
    fresh = Group([_decode()], forked=False, side="plain").run()
    ours_env = Group([_decode()], forked=False, side="ours").run()
    assert [r["omp_wait_policy"] for r in forked.results + fresh.results] == [None, None]
    assert ours_env.results[0]["omp_wait_policy"] == "PASSIVE"


def test_a_client_dying_before_the_barrier_fails_the_group_quickly(zygote) -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="exited before it was ready"):
        Group([_decode(), [*_decode(), "--kind", "nonsense"]], forked=True, zygote=zygote).run()
    assert time.monotonic() - started < 60  # not the group's 30-minute timeout
    again = Group([_decode()], forked=True, zygote=zygote).run()  # the parent goes on serving
    assert len(again.results) == 1


def test_the_window_opens_after_every_clients_warm_up(zygote) -> None:
    """`at_go` (where `watched` reads the executor's figures before the window) runs once, when
    both clients have built their model and warmed up for 2 s: their 0.5 s windows are what is
    left after it."""
    started, opened = time.monotonic(), []
    warm = [*_decode(), "--warmup", "2.0"]
    Group([warm, warm], forked=True, zygote=zygote,
          at_go=lambda: opened.append(time.monotonic())).run()
    ended = time.monotonic()
    assert len(opened) == 1 and opened[0] - started >= 2.0
    assert ended - opened[0] < 2.0  # called at the launch, it would have the warm-ups after it


def test_a_held_client_decodes_until_the_others_are_done(zygote) -> None:
    """A mixed scenario's tenants (`--held`) decode past their window until the jobs beside them
    have made their steps; with no other client a held one ends with its window. (Each window
    opens as its client sees the group's go: under load one may open later than the other.)"""
    held = [*_decode(0.5), "--held"]
    beside = Group([held, _decode(2.0)], forked=True, zygote=zygote).run()
    mine, theirs = (r["started"] + r["elapsed"] for r in beside.results)
    assert mine > theirs  # its own window of 0.5 s, held until the other's 2 s were done
    alone = Group([held], forked=True, zygote=zygote).run()
    assert 0.5 <= alone.results[0]["elapsed"] < 2.0  # its last token came as it closed
