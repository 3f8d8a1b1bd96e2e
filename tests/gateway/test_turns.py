"""A conversation's turn: held by one response at a time, given back once (a second give, or an
earlier holder's, changes nothing), each tenant's conversations apart."""

from __future__ import annotations

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
