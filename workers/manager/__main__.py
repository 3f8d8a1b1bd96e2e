"""`python -m workers.manager --executor E --model BASE --bind ENDPOINT`."""

from __future__ import annotations

import logging
import sys

from state.storage import private_files
from wire.stopping import StopSignal
from workers.manager.broker import Manager
from workers.manager.config import parse_config
from workers.manager.records import Busy

log = logging.getLogger("workers.manager")


def main(argv: list[str] | None = None) -> int:
    private_files()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = parse_config(argv)
    manager = Manager(config, StopSignal())
    log.info("starting with %s", config.model_dump(exclude={"max_jobs"}))  # resolved: at ready
    try:
        manager.serve()
    except Busy as exc:
        holder = f"a worker manager at {exc}" if str(exc) else "a tool changing its records"
        log.error("%s holds the data dir %s; stopping", holder, config.data_dir)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
