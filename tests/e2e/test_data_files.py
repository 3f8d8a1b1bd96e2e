"""What the services leave in the data directory: files for their user alone."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Deployment

pytestmark = pytest.mark.slow


def test_the_services_files_are_private(deployment: Deployment) -> None:
    """The database, adapters and the rest the services wrote: their user's alone."""
    made = [p for p in deployment.stack.data_dir.rglob("*") if p.name != "tenants.json"]
    assert any(p.name == "state.db" for p in made) and any(p.is_dir() for p in made)
    shared = [f"{p}: {oct(p.stat().st_mode & 0o777)}" for p in made
              if p.stat().st_mode & 0o077]
    assert shared == []

