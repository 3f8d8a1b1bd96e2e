"""`python -m gateway [--host] [--port]`: serve the HTTP API (settings from SYMBIOSIS_* env)."""

from __future__ import annotations

import argparse
import logging
import os

import uvicorn

from gateway.app import create_app


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m gateway")
    parser.add_argument("--host", default=os.environ.get("SYMBIOSIS_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("SYMBIOSIS_PORT", "8000")))
    args = parser.parse_args(argv)
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning",
                timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
