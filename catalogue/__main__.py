"""`python -m catalogue export NAME DIR` | `list`."""

from __future__ import annotations

import argparse
import sys

from catalogue.builtin import BUILTINS
from catalogue.resolve import export


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m catalogue")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the built-in models")
    exp = sub.add_parser("export", help="write a built-in model as a Hugging Face model directory")
    exp.add_argument("name", choices=sorted(BUILTINS))
    exp.add_argument("directory")
    args = parser.parse_args(argv)
    if args.command == "list":
        for spec in BUILTINS.values():
            sys.stdout.write(f"{spec.name:16} {spec.description}\n")
        return 0
    path = export(args.name, args.directory)
    sys.stdout.write(f"exported {args.name} to {path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
