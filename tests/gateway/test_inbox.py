"""A request's inbox: items in order, a waiting reader woken by a put, None at the timeout, and
a cancel that is never lost nor loses an item."""

from __future__ import annotations

import asyncio

import pytest

from gateway.inbox import Inbox


def test_items_already_there_come_at_once_in_order():
    async def run() -> list:
        inbox = Inbox()
        for item in ("a", "b", "c"):
            inbox.put(item)
        return [await inbox.get(0.0) for _ in range(3)]

    assert asyncio.run(run()) == ["a", "b", "c"]


def test_a_waiting_reader_gets_what_is_put_later():
    async def run() -> tuple:
        inbox = Inbox()
        reader = asyncio.create_task(inbox.get(30.0))
        await asyncio.sleep(0)
        assert not reader.done()
        inbox.put("x")
        inbox.put("y")
        return await reader, await inbox.get(30.0)

    assert asyncio.run(run()) == ("x", "y")


def test_nothing_within_the_timeout_gives_none_and_a_later_item_still_comes():
    async def run() -> tuple:
        inbox = Inbox()
        nothing = await inbox.get(0.01)
        inbox.put("late")
        return nothing, await inbox.get(0.01)

    assert asyncio.run(run()) == (None, "late")


@pytest.mark.parametrize("put_first", [False, True])
def test_a_cancelled_reader_is_cancelled_and_the_item_stays(put_first):
    """Cancelled while it waits, or in the same turn as an item arrives for it: the cancel is
    raised, and the item is there for the next get."""

    async def run() -> object:
        inbox = Inbox()
        reader = asyncio.create_task(inbox.get(30.0))
        await asyncio.sleep(0)
        if put_first:
            inbox.put("met")
            reader.cancel()
        else:
            reader.cancel()
            inbox.put("met")
        with pytest.raises(asyncio.CancelledError):
            await reader
        return await inbox.get(0.0)

    assert asyncio.run(run()) == "met"
