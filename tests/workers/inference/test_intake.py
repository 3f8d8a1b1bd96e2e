"""A worker's intake (`workers.inference.intake`): the API requests whose prompts wait take
turns, each request's prompts in their order; those dropped are never taken."""

from __future__ import annotations

from wire import manager as W
from workers.inference.intake import Intake


def asked(request_id: str, group: str) -> W.Generate:
    return W.Generate(request_id, "acme", "tiny-llama", W.SamplingParams(), prompt="x",
                      group=group)


def taken(intake: Intake) -> list[str]:
    ids = []
    while intake:
        ids.append(intake.take().id)
    return ids


def test_requests_take_turns_each_ones_prompts_in_order() -> None:
    intake = Intake()
    intake.extend([asked(f"big-{i}", "big") for i in range(4)])
    intake.extend([asked("chat-0", "chat")])
    intake.extend([asked("other-0", "other"), asked("other-1", "other")])
    assert len(intake) == 7
    assert [r.id for r in intake] == ["big-0", "big-1", "big-2", "big-3", "chat-0", "other-0",
                                      "other-1"]
    assert taken(intake) == ["big-0", "chat-0", "other-0", "big-1", "other-1", "big-2", "big-3"]
    assert len(intake) == 0 and not intake


def test_prompts_without_a_group_are_one_group() -> None:
    intake = Intake()
    intake.extend([asked("a", ""), asked("b", ""), asked("c", "g")])
    intake.extend([asked("d", "")])
    assert taken(intake) == ["a", "c", "b", "d"]


def test_dropped_requests_are_never_taken_and_the_rest_keep_their_turns() -> None:
    intake = Intake()
    intake.extend([asked(f"big-{i}", "big") for i in range(3)] + [asked("chat-0", "chat")])
    intake.extend([asked("other-0", "other")])
    intake.drop({"big-0", "chat-0", "unknown"})
    assert len(intake) == 3
    assert taken(intake) == ["big-1", "other-0", "big-2"]
