"""`python -m gateway.openapi_export [PATH]`: write the gateway's OpenAPI document (committed as
openapi/openapi.json; a test fails when the app and the document drift apart)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gateway.app import create_app

DOCUMENT = Path(__file__).resolve().parents[1] / "openapi" / "openapi.json"


def render() -> str:
    return json.dumps(create_app().openapi(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0]) if args else DOCUMENT
    target.write_text(render())
    sys.stdout.write(f"wrote {target}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
