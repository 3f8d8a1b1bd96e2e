"""`python -m executor.ping ENDPOINT`: exit 0 if the executor answers (container healthcheck)."""

from __future__ import annotations

import os
import sys

from wire.probes import executor_answers


def main() -> int:
    endpoint = sys.argv[1] if len(sys.argv) > 1 else os.environ["SYMBIOSIS_EXECUTOR"]
    key = os.environ.get("SYMBIOSIS_EXECUTOR_CURVE_PUBLIC")
    return 0 if executor_answers(endpoint, server_key=key) else 1


if __name__ == "__main__":
    raise SystemExit(main())
