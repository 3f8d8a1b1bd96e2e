"""`python -m workers.manager.ping ENDPOINT`: exit 0 if the worker manager answers
(container healthcheck)."""

from __future__ import annotations

import sys

from wire.probes import manager_answers
from workers.manager.config import ManagerConfig


def main() -> int:
    endpoint = sys.argv[1] if len(sys.argv) > 1 else ManagerConfig().bind
    return 0 if manager_answers(endpoint) else 1


if __name__ == "__main__":
    raise SystemExit(main())
