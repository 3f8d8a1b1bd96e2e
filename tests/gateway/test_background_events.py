"""A streamed background response's kept events: followed from the start or past a sequence
number, those to come as they come, to the end."""

from __future__ import annotations

import asyncio

from gateway.background_events import Events


def test_followers_have_the_events_past_theirs_and_those_that_come() -> None:
    async def followed() -> tuple[list[bytes], list[bytes], list[bytes]]:
        events = Events()
        events.add(b"0")
        events.add(b"1")

        async def take(after: int | None) -> list[bytes]:
            return [block async for block in events.follow(after)]

        everything = asyncio.ensure_future(take(None))
        past_zero = asyncio.ensure_future(take(0))
        await asyncio.sleep(0.01)
        assert not everything.done()  # waiting for more
        events.add(b"2")
        await asyncio.sleep(0.01)
        events.add(b"3")
        events.end()
        return await everything, await past_zero, await take(2)

    everything, past_zero, late = asyncio.run(followed())
    assert everything == [b"0", b"1", b"2", b"3"]
    assert past_zero == [b"1", b"2", b"3"] and late == [b"3"]
