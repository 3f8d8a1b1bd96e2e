"""A streamed background response's kept events: opened as OpenAI opens one (created and
queued), the run's own events numbered on (its `response.created` left out), followed from the
start or past a sequence number, those to come as they come, to the end."""

from __future__ import annotations

import asyncio
import json

from gateway.background_events import Events
from gateway.responses import sse

QUEUED = {"id": "resp_1", "status": "queued"}


def parsed(blocks: list[bytes]) -> list[tuple[str, int]]:
    """(event line's name, sequence_number) of each SSE block."""
    out = []
    for block in blocks:
        name, data = block.decode().strip().split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        out.append((event["type"], event["sequence_number"]))
    return out


def test_followers_have_the_events_past_theirs_and_those_that_come() -> None:
    async def followed() -> tuple[list[bytes], list[bytes], list[bytes]]:
        events = Events(QUEUED)
        events.run_sent(sse({"type": "response.created", "sequence_number": 0,
                             "response": QUEUED | {"status": "in_progress"}}))
        events.run_sent(sse({"type": "response.in_progress", "sequence_number": 1}))

        async def take(after: int | None) -> list[bytes]:
            return [block async for block in events.follow(after)]

        everything = asyncio.ensure_future(take(None))
        past_two = asyncio.ensure_future(take(1))
        await asyncio.sleep(0.01)
        assert not everything.done()  # waiting for more
        events.run_sent(sse({"type": "response.output_text.delta", "sequence_number": 2,
                             "delta": "Hi"}))
        await asyncio.sleep(0.01)
        events.run_sent(sse({"type": "response.completed", "sequence_number": 3}))
        events.end()
        return await everything, await past_two, await take(3)

    everything, past_two, late = asyncio.run(followed())
    assert parsed(everything) == [("response.created", 0), ("response.queued", 1),
                                  ("response.in_progress", 2),
                                  ("response.output_text.delta", 3), ("response.completed", 4)]
    assert past_two == everything[2:] and late == everything[4:]
    assert json.loads(everything[0].decode().split("data: ")[1])["response"] == QUEUED
