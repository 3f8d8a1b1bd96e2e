"""`python -m gateway.openapi_export [PATH]`: write the gateway's OpenAPI document (committed as
openapi/openapi.json; a test fails when the app and the document drift apart)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

DOCUMENT = Path(__file__).resolve().parents[1] / "openapi" / "openapi.json"


EXACT = {float(v): v for v in (2**63 - 1, -(2**63))}  # int64 bounds a float cannot hold


def exact_bounds(node: object) -> object:
    """The document with integer bounds exact: FastAPI's OpenAPI models hold `minimum` and
    `maximum` as floats, and float(2**63 - 1) is 2**63 (a seed one past the range would look
    schema-valid)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("minimum", "maximum") and value in EXACT and isinstance(value, float):
                node[key] = EXACT[value]
            else:
                exact_bounds(value)
    elif isinstance(node, list):
        for value in node:
            exact_bounds(value)
    return node


def render() -> str:
    from gateway.app import create_app

    return json.dumps(create_app().openapi(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0]) if args else DOCUMENT
    target.write_text(render())
    sys.stdout.write(f"wrote {target}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
