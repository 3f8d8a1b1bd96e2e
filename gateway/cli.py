"""`symbiosis`: the command line. Starts processes; never imports torch itself."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="symbiosis")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="an executor and two tenants training and generating")
    demo.add_argument("--model", default="tiny-llama")
    args = parser.parse_args(argv)
    if args.command == "demo":
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        return subprocess.call([sys.executable, "-m", "workers.demo", "--model", args.model],
                               env=env)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
