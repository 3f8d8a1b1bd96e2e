"""workers.manager.requests: the requests in flight, and the Aborts that take them out."""

from __future__ import annotations

from wire import manager as W
from workers.manager.requests import Requests


def generate(request_id: str, tenant: str) -> W.Generate:
    return W.Generate(request_id, tenant, "tiny-llama", W.SamplingParams(), prompt="hi")


def test_an_abort_of_several_names_each_worker_its_own_and_passes_over_the_unknown() -> None:
    requests = Requests()
    for request_id, worker in (("r0", "acme"), ("r1", "beta"), ("r2", "acme"), ("r3", "beta")):
        requests.add(b"gateway", generate(request_id, worker), worker, 1)
    by_worker = requests.drop_all(["r2", "gone", "r1", "r0"])
    assert by_worker == {"acme": ["r2", "r0"], "beta": ["r1"]}
    assert list(requests.routes) == ["r3"] and list(requests.unanswered) == ["r3"]
    assert requests.answer(W.Done("r0", 1, 1)) is None  # an aborted one's late reply is dropped
    assert requests.drop_all(["r0", "r2"]) == {}
