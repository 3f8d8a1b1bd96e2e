"""`python -m gateway.healthcheck [URL]`: exit 0 if GET URL (default /ready) answers 200."""

from __future__ import annotations

import sys
import urllib.request

from gateway.settings import GatewaySettings


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else \
        f"http://127.0.0.1:{GatewaySettings().port}/ready"
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return 0 if response.status == 200 else 1
    except OSError:
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
