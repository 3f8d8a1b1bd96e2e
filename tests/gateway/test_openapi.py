"""The committed OpenAPI document is the app's own; and our paths are OpenAI's."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gateway.openapi_export import DOCUMENT, render

OPENAI_SPEC = Path(__file__).parents[1] / "data" / "openai-openapi-subset.yaml"


def test_committed_document_matches_the_app() -> None:
    fresh = DOCUMENT.read_text() == render()  # (pytest's diff of two big strings takes minutes)
    assert fresh, "openapi/openapi.json is stale: run `python -m gateway.openapi_export`"


def test_openai_paths_are_served_under_v1() -> None:
    ours = set(json.loads(DOCUMENT.read_text())["paths"])
    theirs = set(re.findall(r"^  (/[a-z_/{}]+):\s*$", OPENAI_SPEC.read_text(), re.MULTILINE))
    assert theirs, "could not read OpenAI's spec"
    for path in ("/completions", "/chat/completions", "/models", "/models/{model}"):
        assert path in theirs
        assert f"/v1{path}" in ours
