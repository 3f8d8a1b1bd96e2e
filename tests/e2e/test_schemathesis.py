"""Schemathesis over the published spec (openapi/openapi.json) against a running stack, with
every check: no server error, every response as documented. The one kind of rejection allowed
is a schema-valid upload whose contents are not a valid fine-tuning file or adapter (no schema
can say what a valid JSONL file is)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from launcher.stack import Stack, free_port

pytestmark = pytest.mark.slow
SPEC = Path(__file__).parents[2] / "openapi" / "openapi.json"
CONTENT_REJECTIONS = {"POST /v1/files": "invalid_file_format",
                      "POST /v1/adapters": "invalid_adapter"}


def test_the_spec_holds_under_schemathesis(tmp_path) -> None:
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    assert st, "schemathesis is installed with the test extras"
    stack = Stack(tmp_path / "data", "tiny-llama", port=free_port(),
                  # a short context keeps every generated request quick: a chat without
                  # max_tokens runs to the context's end (n=8 of 2,048 tokens took ~45 s, past
                  # the request timeout under two workers)
                  env={"SYMBIOSIS_API_KEYS": "acme=sk-schemathesis",
                       "SYMBIOSIS_MAX_CONTEXT": "256"}).start()
    report = tmp_path / "junit.xml"
    try:
        run = subprocess.run(
            [st, "run", str(SPEC), "--url", stack.base_url, "-H",
             "Authorization: Bearer sk-schemathesis", "--checks", "all", "--max-examples", "60",
             "--seed", "1", "--workers", "2", "--request-timeout", "60",
             "--report", "junit", "--report-junit-path", str(report)],
            capture_output=True, text=True, timeout=900)
    finally:
        stack.stop()
    cases = int(re.search(r"(\d+) generated", run.stdout).group(1))
    assert cases >= 1500, run.stdout[-3000:]
    unexpected = []
    for case in ET.parse(report).getroot().iter("testcase"):
        allowed = CONTENT_REJECTIONS.get(case.get("name", ""))
        for failure in [*case.iter("failure"), *case.iter("error")]:
            text = failure.text or ""
            only_content = (failure.get("message") == "ST202" and allowed is not None
                            and allowed in text and text.count("\n- ") == 1)
            if not only_content:  # the end of the text holds the cause (and a curl to replay)
                unexpected.append(f"{case.get('name')}: {failure.get('message')}\n"
                                  f"{text[-1500:]}")
    assert not unexpected, "\n\n".join(unexpected)

