"""A conversation's turn: held by one response at a time, given back once (a second give, or an
earlier holder's, changes nothing), each tenant's conversations apart; a background run waits
for it until it is given back, or until it leaves."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import APIError
from gateway.turns import Turns


def test_a_turn_is_held_by_one_and_given_back_once() -> None:
    turns = Turns()
    give = turns.take("acme", "conv_1")
    with pytest.raises(APIError) as locked:
        turns.take("acme", "conv_1")
    assert (locked.value.status, locked.value.code, locked.value.param) == \
        (400, "conversation_locked", "conversation")
    other = turns.take("acme", "conv_2")  # another conversation, and another tenant's:
    theirs = turns.take("beta", "conv_1")
    give()
    again = turns.take("acme", "conv_1")
    give()  # the first holder's give, twice: the second holder keeps it
    with pytest.raises(APIError):
        turns.take("acme", "conv_1")
    for each in (again, other, theirs):
        each()
    assert turns.held == {}


def test_a_run_waits_for_the_turn_until_it_is_given_back_or_it_leaves() -> None:
    async def waited() -> tuple[bool, bool, object]:
        turns, leave = Turns(), asyncio.Event()
        give = turns.take("acme", "conv_1")
        waiting = asyncio.create_task(turns.wait("acme", "conv_1", leave))
        await asyncio.sleep(0.2)
        still = not waiting.done()
        give()
        taken = await asyncio.wait_for(waiting, 1.0)
        held = ("acme", "conv_1") in turns.held
        leaving = asyncio.create_task(turns.wait("acme", "conv_1", leave))
        leave.set()
        return still, held and taken is not None, await asyncio.wait_for(leaving, 1.0)

    assert asyncio.run(waited()) == (True, True, None)
