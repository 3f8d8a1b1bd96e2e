"""An inference worker (its adapters, engine and executor client, in this process) against a real
executor process: a request's latency targets, from its `Generate`, ride on every executor call
of the steps it runs in, and the executor counts those calls against them."""

from __future__ import annotations

import time

import pytest

from tests.helpers import ExecutorProcess
from wire import manager as W
from wire.call import messages as P
from wire.spawner import WorkerSpec
from workers.inference.preloaded import preload
from workers.inference.worker import _generate, build_adapters
from workers.remote.client import ExecutorClient

MODEL = "tiny-llama"


@pytest.fixture()
def llama(executor_for) -> ExecutorProcess:
    return executor_for(MODEL)


def _lane(endpoint: str, name: str = "decode") -> tuple[int, int]:
    """The executor's calls in lane `name` so far, and those that met their target."""
    watcher = ExecutorClient(endpoint, name="watcher")
    try:
        lane = watcher.stats().lanes[name]
        return lane.calls, lane.met
    finally:
        watcher.close()


def test_a_requests_targets_reach_the_executor_with_its_calls(llama: ExecutorProcess) -> None:
    preloaded = preload(MODEL)
    spec = WorkerSpec(key="targets-worker", tenant="acme", base=MODEL, executor=llama.endpoint,
                      manager="inproc://unused")
    adapters = build_adapters(spec, preloaded)
    params = W.SamplingParams(max_tokens=6, temperature=0)

    def generate(targets: P.CallTargets) -> tuple[int, int]:
        """The decode lane's calls and those that met their target, over one request."""
        before = _lane(llama.endpoint)
        refused = _generate(W.Generate(f"r{targets.decode_us}", "acme", MODEL, params,
                                       prompt_ids=[5, 6, 7, 8], targets=targets),
                            adapters, preloaded)
        assert refused == []
        engine = adapters.engine
        events: list[W.Message] = []
        while engine.has_work():
            events += engine.step()
        assert isinstance(events[-1], W.Done) and events[-1].completion_tokens == 6
        after = _lane(llama.endpoint)
        return after[0] - before[0], after[1] - before[1]

    # a microsecond: no call is queued and picked that fast, so each one misses
    calls, met = generate(P.CallTargets(decode_us=1, prefill_us=1))
    assert calls > 0 and met == 0
    calls, met = generate(P.CallTargets(decode_us=P.TARGET_MAX_US, prefill_us=P.TARGET_MAX_US))
    assert calls > 0 and met == calls


def test_an_inter_token_target_sets_the_waits_of_the_calls_after_its_first_step(
        llama: ExecutorProcess) -> None:
    """A tenant that asks 1 us between tokens and no wait per call: its first step carries the
    executor's own waits (nothing measured yet); every step after it took far longer than 1 us,
    so its calls carry 1 us and miss (the rule's figures: test_pacing.py)."""
    preloaded = preload(MODEL)
    spec = WorkerSpec(key="pacing-worker", tenant="acme", base=MODEL, executor=llama.endpoint,
                      manager="inproc://unused")
    adapters = build_adapters(spec, preloaded)
    params = W.SamplingParams(max_tokens=10, temperature=0)

    assert _generate(W.Generate("paced", "acme", MODEL, params, prompt_ids=[5, 6, 7, 8],
                                token_targets=W.TokenTargets(inter_token_us=1)),
                     adapters, preloaded) == []
    paced, last = [], _lane(llama.endpoint)  # the decode lane's calls and met, per step
    while adapters.engine.has_work():
        adapters.engine.step()
        now = _lane(llama.endpoint)
        paced.append((now[0] - last[0], now[1] - last[1]))
        last = now
    assert len(paced) == 9 and all(calls > 0 for calls, _ in paced)  # 10 tokens
    assert all(met == 0 for _, met in paced[2:])  # the first two steps were not yet measured


@pytest.mark.parametrize("waited_s", [0.0, 30.0])
def test_the_time_to_first_token_counts_from_the_requests_arrival(executor_for,
                                                                   waited_s: float) -> None:
    """A request that arrived 30 s before the worker had it (`Generate.arrived`: it waited for
    a worker to start, or a slot) missed its 5 s TTFT target: the pacer cuts the prefill waits
    to 1 us, so the next request's prefill calls all miss. Without that wait, the first
    request met its target with room, and the next one's prefill calls carry the executor's own
    wait (1 s here), or the target over their count if less: far more than a lone client's
    calls wait, so they meet it."""
    llama = executor_for(MODEL, prefill_target_ms="1000")
    preloaded = preload(MODEL)
    spec = WorkerSpec(key=f"ttft-worker-{waited_s:g}", tenant="acme", base=MODEL,
                      executor=llama.endpoint, manager="inproc://unused")
    adapters = build_adapters(spec, preloaded)
    params = W.SamplingParams(max_tokens=2, temperature=0)
    targets = W.TokenTargets.from_ms(5000, 0)

    def serve(name: str, arrived: float) -> tuple[int, int]:
        before = _lane(llama.endpoint, "prefill")
        prompt = list(range(5, 45))  # over 32 rows: the executor's prefill lane
        assert _generate(W.Generate(name, "acme", MODEL, params, prompt_ids=prompt,
                                    token_targets=targets, arrived=arrived),
                         adapters, preloaded) == []
        while adapters.engine.has_work():
            adapters.engine.step()
        after = _lane(llama.endpoint, "prefill")
        return after[0] - before[0], after[1] - before[1]

    serve("first", time.monotonic() - waited_s)
    calls, met = serve("next", 0.0)  # 0: not stamped, from the worker's own receipt
    assert calls > 0
    assert met == (0 if waited_s else calls)
