"""How a trainer's process runs beside inference: at a lower priority (`priority`), giving its
large frees back at once (`allocator`). The spawner's trainers and the bench's trainer clients
alike take these settings, before torch starts its threads."""

from __future__ import annotations

from workers.training.allocator import give_back_large_frees
from workers.training.priority import yield_to_inference


def run_as_trainer() -> None:
    yield_to_inference()
    give_back_large_frees()
