"""Fixtures of the workers' tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture()
def threads_back():
    """torch's threads in this process as they were, after a test that sets them."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
