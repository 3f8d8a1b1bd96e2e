"""Work that can take the gateway a while runs on worker threads, never on the event loop that
answers every tenant: an output constraint's grammar (llguidance took half a second over an
880 KB schema), for chat completions, completions and responses, and a response's history and
references read from the records, and a stored response read back."""

from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient

from gateway import structured
from gateway.app import create_app
from gateway.routes import responses
from gateway.settings import GatewaySettings

KEY = {"Authorization": "Bearer sk-acme"}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
CALL = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}
ASKED = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                              "response_format": {"type": "json_schema", "json_schema": {
                                  "name": "x", "schema": SCHEMA}}}, "_checked"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                              "tools": [CALL], "tool_choice": "required"}, "_checked"),
    ("/v1/completions", {"prompt": "Hi", "response_format": {"type": "json_object"}},
     "_checked"),
    ("/v1/responses", {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x",
                                                          "schema": SCHEMA}}}, "_checked"),
    ("/v1/responses", {"input": "Hi"}, "asked"),
    ("/v1/responses/input_tokens", {"input": "Hi"}, "asked"),
]


@pytest.mark.parametrize(("path", "body", "work"), ASKED)
def test_the_work_runs_on_a_thread_other_than_the_event_loops(tmp_path, monkeypatch, path,
                                                                body, work) -> None:
    module = structured if work == "_checked" else responses
    real, threads = getattr(module, work), []

    def watched(*args, **kwargs):
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, work, watched)
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                               manager="ipc:///tmp/symbiosis-test-no-manager.sock")
    with TestClient(create_app(settings)) as client:
        loop = client.portal.call(threading.current_thread)
        answer = client.post(path, headers=KEY, json={"model": "tiny-llama", "max_tokens": 4,
                                                      **body} if "completions" in path else
                             {"model": "tiny-llama", **body})
    assert answer.status_code == 503, answer.text  # after the work: no manager to run it
    assert threads and loop not in threads, (threads, loop)


@pytest.mark.parametrize("path", [f"/v1/responses/resp_{'a' * 32}",
                                  f"/v1/responses/resp_{'a' * 32}/input_items"])
def test_a_stored_response_is_read_on_a_thread_other_than_the_event_loops(tmp_path, monkeypatch,
                                                                          path) -> None:
    real, threads = responses.found, []

    def watched(*args, **kwargs):
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(responses, "found", watched)
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                               manager="ipc:///tmp/symbiosis-test-no-manager.sock")
    with TestClient(create_app(settings)) as client:
        loop = client.portal.call(threading.current_thread)
        answer = client.get(path, headers=KEY)
    assert answer.status_code == 404, answer.text  # read, and none is kept
    assert threads and loop not in threads, (threads, loop)
