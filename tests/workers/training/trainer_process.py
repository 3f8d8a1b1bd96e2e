"""`python -m tests.workers.training.trainer_process SPEC_JSON`: a trainer in its own process
that may not touch the database. An audit hook ends the process (exit 86) on any SQLite
connection and on any open of the data dir's `state.db` (or its -wal/-shm files)."""

from __future__ import annotations

import os
import sys


def _guard(event: str, args: tuple) -> None:
    opened = event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) and \
        os.path.basename(os.fsdecode(args[0])).startswith("state.db")
    if event == "sqlite3.connect" or opened:
        os.write(2, f"the trainer touched the database: {event} {args[:1]}\n".encode())
        os._exit(86)


def main() -> int:
    sys.addaudithook(_guard)
    import msgspec
    from transformers import AutoTokenizer

    from catalogue.resolve import resolve_model
    from wire.spawner import TrainerSpec
    from workers.training.runner import run

    spec = msgspec.json.decode(sys.argv[1], type=TrainerSpec)
    return run(spec, AutoTokenizer.from_pretrained(resolve_model(spec.base)))


if __name__ == "__main__":
    raise SystemExit(main())
