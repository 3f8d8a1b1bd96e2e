"""`python -m executor.ping [ENDPOINT]`: exit 0 if the executor answers (container healthcheck);
ENDPOINT defaults to the one the worker manager uses (SYMBIOSIS_EXECUTOR)."""

from __future__ import annotations

import sys

from wire.endpoints import default_executor
from wire.host import host
from wire.probes import executor_answers


def main() -> int:
    settings = host()
    endpoint = sys.argv[1] if len(sys.argv) > 1 else settings.executor or default_executor()
    return 0 if executor_answers(endpoint, server_key=settings.executor_curve_public) else 1


if __name__ == "__main__":
    raise SystemExit(main())
