"""Every answer of ours that OpenAI's spec describes has the shape OpenAI's own schema gives it
(`tests/openai_spec.py`), read as the bytes a client gets, through a real stack: no null where
OpenAI's schema allows a field to be absent but not null (a typed client reads a null
`system_fingerprint` as a bad string), every key it requires (a chat choice's logprobs name
`refusal` too). OpenAI's spec here has no Responses API: its answers and stream events are held
to the official SDK's types instead. Our own published contract is Schemathesis's to check
(test_schemathesis.py)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from launcher.stack import Stack
from tests.e2e.adapters import MODEL
from tests.e2e.conftest import KEYS
from tests.e2e.jobs import memorization_file, start_stack
from tests.openai_spec import operations, violations

pytestmark = pytest.mark.slow
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
TOOL = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["x"], "additionalProperties": False}}}
OURS = json.loads((Path(__file__).parents[2] / "openapi" / "openapi.json").read_text())["paths"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    stack = start_stack(tmp_path_factory.mktemp("shapes") / "data")
    yield stack
    stack.stop()


class Checker:
    """Calls the stack and checks each answer against OpenAI's schema for its operation."""

    def __init__(self, stack: Stack) -> None:
        self.http = httpx.Client(base_url=f"{stack.base_url}/v1", timeout=120,
                                 headers={"Authorization": f"Bearer {KEYS['acme']}"})
        self.seen: set[tuple[str, str]] = set()
        self.problems: list[str] = []

    def call(self, method: str, path: str, *, unlisted: dict | None = None, **kwargs) -> dict:
        """`unlisted`: values of ours that OpenAI's schema does not list, and what it lists
        instead, each said where it is passed."""
        response = self.http.request(method, path, **kwargs)
        assert response.status_code == 200, (method, path, response.text)
        operation = (method, _template(path))
        self.seen.add(operation)
        if operations()[operation] is None:  # not JSON (a file's content)
            return {}
        body = response.json()
        self.problems += violations(operations()[operation], {**body, **(unlisted or {})})
        return body

    def stream(self, path: str, body: dict, schema: str, *, final_only: bool = False) -> int:
        """Each `data:` event of a streamed answer against `schema`; `final_only`: only those
        that end a choice or carry the usage. Returns how many were checked. Each delta is
        obfuscated (`gateway/obfuscation.py`) unless the request turns it off: its event fills
        whole 64-byte blocks."""
        checked = 0
        obfuscated = (body.get("stream_options") or {}).get("include_obfuscation", True)
        with self.http.stream("POST", path, json={**body, "stream": True}) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                if chunk["choices"]:
                    assert ("obfuscation" in chunk) == obfuscated, chunk
                    assert len(line.encode()) % 64 == len("data: ") or not obfuscated
                ends = any(c.get("finish_reason") for c in chunk["choices"]) or chunk.get("usage")
                if ends or not final_only:
                    self.problems += violations(schema, chunk)
                    checked += 1
        self.seen.add(("POST", path))
        return checked


def test_every_answer_openai_describes_has_openai_s_shape(stack: Stack) -> None:
    check = Checker(stack)
    check.call("POST", "/completions", json={"model": MODEL, "prompt": ["Hi", "Yo"],
                                             "max_tokens": 3, "n": 2, "logprobs": 2})
    # echo without logprobs: with them, echo's first token has a null logprob, as OpenAI's own
    # answers have it and its schema does not
    check.call("POST", "/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 3,
                                             "echo": True})
    check.call("POST", "/chat/completions", json={**CHAT, "logprobs": True, "top_logprobs": 2})
    called = check.call("POST", "/chat/completions", json={**CHAT, "max_tokens": 40,
                                                           "tools": [TOOL],
                                                           "tool_choice": "required"})
    assert called["choices"][0]["message"]["tool_calls"], called
    check.call("POST", "/chat/completions", json={**CHAT, "store": True,
                                                  "metadata": {"shape": "stored"}})
    assert check.call("GET", "/chat/completions", params={"metadata[shape]": "stored"})["data"]
    usage = {"stream_options": {"include_usage": True}}
    assert check.stream("/chat/completions", {**CHAT, **usage, "logprobs": True},
                        "CreateChatCompletionStreamResponse") >= 4
    assert check.stream("/chat/completions", {**CHAT, "stream_options": {
        "include_obfuscation": False}}, "CreateChatCompletionStreamResponse") >= 4
    assert check.stream("/chat/completions", {**CHAT, "max_tokens": 40, "tools": [TOOL],
                                              "tool_choice": "required"},
                        "CreateChatCompletionStreamResponse") >= 3
    # OpenAI's one completion schema requires a finish reason, which its own stream leaves null
    # until a choice's last event: those events and the usage are checked
    assert check.stream("/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 3,
                                         **usage}, "CreateCompletionResponse",
                        final_only=True) == 2
    check.call("GET", "/models")
    check.call("GET", f"/models/{MODEL}")

    upload = check.call("POST", "/files", data={"purpose": "fine-tune"},
                        files={"file": ("memo.jsonl", memorization_file())})
    check.call("GET", "/files")
    check.call("GET", f"/files/{upload['id']}")
    check.call("GET", f"/files/{upload['id']}/content")
    job = check.call("POST", "/fine_tuning/jobs", json={
        "model": MODEL, "training_file": upload["id"], "hyperparameters": {"n_epochs": 1}})
    long = check.call("POST", "/fine_tuning/jobs", json={
        "model": MODEL, "training_file": upload["id"], "hyperparameters": {"n_epochs": 50}})
    check.call("GET", "/fine_tuning/jobs")
    _until(check, long["id"], "running")  # paused at once: it cannot end before its cancel
    # OpenAI's pause answers a job whose status its schema's list lacks
    check.call("POST", f"/fine_tuning/jobs/{long['id']}/pause", unlisted={"status": "running"})
    job = _until(check, job["id"], "succeeded")
    check.call("GET", f"/fine_tuning/jobs/{job['id']}/events")
    check.call("GET", f"/fine_tuning/jobs/{job['id']}/checkpoints")
    check.call("POST", f"/fine_tuning/jobs/{long['id']}/resume")
    check.call("POST", f"/fine_tuning/jobs/{long['id']}/cancel")
    check.call("GET", f"/models/{job['fine_tuned_model']}")
    check.call("DELETE", f"/models/{job['fine_tuned_model']}")
    check.call("DELETE", f"/files/{upload['id']}")

    assert check.problems == [], "\n".join(check.problems)
    served = {(method.upper(), re.sub(r"\{[^}]*\}", "{}", path.removeprefix("/v1")))
              for path, methods in OURS.items() for method in methods}
    assert check.seen == set(operations()) & served  # every operation both describe


def test_responses_answers_are_the_official_sdk_s_types(stack: Stack) -> None:
    check = Checker(stack)
    function = {"type": "function", "name": "pick", "strict": True,
                "parameters": TOOL["function"]["parameters"]}
    events = TypeAdapter(ResponseStreamEvent)
    for body in ({"input": "Hello", "max_output_tokens": 4},
                 {"input": "Hello", "max_output_tokens": 40, "tools": [function],
                  "tool_choice": "required"},
                 {"input": "Hello", "max_output_tokens": 4, "top_logprobs": 2,
                  "include": ["message.output_text.logprobs"]}):
        answer = check.http.post("/responses", json={"model": MODEL, **body})
        assert answer.status_code == 200, answer.text
        Response.model_validate(answer.json())
        with check.http.stream("POST", "/responses",
                               json={"model": MODEL, "stream": True, **body}) as streamed:
            lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
        assert len(lines) >= 6
        for line in lines:
            event = json.loads(line[len("data: "):])
            events.validate_python(event)
            assert ("obfuscation" in event) == event["type"].endswith(".delta"), event


def _until(check: Checker, job_id: str, status: str, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while (job := check.call("GET", f"/fine_tuning/jobs/{job_id}"))["status"] != status:
        assert job["status"] not in ("failed", "cancelled", "succeeded"), job
        assert time.monotonic() < deadline, f"{job_id} never reached {status}: {job}"
        time.sleep(0.2)
    return job


def _template(path: str) -> str:
    """`path` with its ids (a model's, a file's, a job's) as {}."""
    path = re.sub(r"^/models/.+$", "/models/{}", path)
    return re.sub(r"/(file|ftjob)-[^/]*", "/{}", path)
