"""The executor tests' fake clock (`tests.executor.queued.Clock`)."""

from __future__ import annotations

import pytest

from tests.executor.queued import Clock


@pytest.fixture()
def clock() -> Clock:
    return Clock()
