"""Gateway <-> manager <-> worker messages survive a round trip (and stay torch-free); several
requests or replies make one frame's message, which carries them in their order, and one is
itself."""

from __future__ import annotations

import pytest

from wire import manager as W

PARAMS = W.SamplingParams(max_tokens=5, temperature=0.5, top_p=0.9, top_k=4, n=2, seed=3,
                          stop=["\n"], logprobs=2, echo=True, ignore_eos=True, min_tokens=1)
MESSAGES = [
    W.Generate("r1", "acme", "acme/x", PARAMS, W.AdapterRef("/a", "LORA"), prompt="hi"),
    W.Generate("r2", "acme", "base", W.SamplingParams(), prompt_ids=[1, 2],
               messages=[W.ChatMessage("user", "hi")], max_context=100, fallback=True),
    W.Abort(["r1", "r2"]),
    W.Started("r1", 4, True, "hi", [W.TokenLogprob("h", float("-0.5"), [("h", -0.5)], [104])]),
    W.Delta("r1", 1, "text", [W.TokenLogprob("t", -1.0, [], [116])], "stop"),
    W.Done("r1", 4, 2),
    W.Failed("r1", 503, "worker_unavailable", "gone"),
    W.Ready("acme", 12, 0.5),
    W.LoadFailed("acme", "bad"),
    W.Unload("acme/x@2"),
    W.Stop(),
    W.Status(),
    W.StatusReply([W.WorkerInfo("k", "t", ["m", "t/x@1"], 1, "ready", 0, 1.5, False)], True,
                  {"a": 1}),
    W.Prefetch("acme", "acme/x@2", W.AdapterRef("/a", "LORA")),
]
MESSAGES += [W.Generates(MESSAGES[:2]), W.Replies(MESSAGES[3:7])]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(message) -> None:
    assert W.decode(W.encode(message)) == message


def test_requests_or_replies_framed_are_carried_in_their_order() -> None:
    requests, replies = MESSAGES[:2], MESSAGES[3:7]
    assert W.framed(requests) == W.Generates(requests)
    assert W.framed(replies) == W.Replies(replies)
    assert W.framed(replies[:1]) is replies[0]
    for messages in (requests, replies, replies[:1]):
        assert W.unframed(W.decode(W.encode(W.framed(messages)))) == messages
    assert W.unframed(W.Stop()) == [W.Stop()]
    with pytest.raises(TypeError):
        W.framed([*replies, W.Stop()])  # would not decode as Replies: the frame would be lost
    with pytest.raises(TypeError):
        W.framed([requests[0], replies[0]])
