"""A batch input file is checked line by line at upload; each fault is named with its line."""

from __future__ import annotations

import json

import pytest

from gateway.batch_file import MAX_REQUESTS, InvalidBatchFile, check_lines

CHAT = {"method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}


def lines(*requests: dict) -> list[bytes]:
    return [json.dumps(r).encode() + b"\n" for r in requests]


def test_a_good_file_counts_its_requests_and_names_its_url_and_model() -> None:
    checked = check_lines([*lines({"custom_id": "a", **CHAT}), b"\n",
                           *lines({"custom_id": "b", **CHAT})])
    assert (checked.requests, checked.url, checked.model) == (2, "/v1/chat/completions", "m")
    mixed = check_lines(lines({"custom_id": "a", **CHAT},
                              {"custom_id": "b", **CHAT, "body": {"model": "acme/bot"}}))
    assert mixed.model is None  # a batch may mix a tenant's adapters


@pytest.mark.parametrize(("raw", "fault"), [
    ([b"{not json\n"], "Line 1 is not JSON."),
    ([b"[1, 2]\n"], "Line 1 is not a JSON object."),
    (lines({"custom_id": "a", **CHAT}, {**CHAT}), "Line 2 has no custom_id"),
    (lines({"custom_id": "a", **CHAT}, {"custom_id": "a", **CHAT}), "Line 2: custom_id 'a' is "
     "not unique."),
    (lines({"custom_id": "a", **CHAT, "method": "GET"}), "Line 1: method must be 'POST'."),
    (lines({"custom_id": "a", **CHAT, "url": "/v1/moderations"}), "Line 1: url must be one of"),
    (lines({"custom_id": "a", **CHAT}, {"custom_id": "b", **CHAT, "url": "/v1/completions"}),
     "Line 2: every request of a batch goes to one url (/v1/chat/completions)."),
    (lines({"custom_id": "a", **CHAT, "body": "text"}), "Line 1: body must be a JSON object."),
    ([b"\n", b"  \n"], "The file holds no requests."),
])
def test_a_fault_is_refused_naming_its_line(raw: list[bytes], fault: str) -> None:
    with pytest.raises(InvalidBatchFile) as refused:
        check_lines(raw)
    assert str(refused.value).startswith(fault)


def test_a_file_of_more_requests_than_a_batch_holds_is_refused() -> None:
    many = (json.dumps({"custom_id": str(k), **CHAT}).encode() for k in range(MAX_REQUESTS + 1))
    with pytest.raises(InvalidBatchFile, match=f"at most {MAX_REQUESTS} requests"):
        check_lines(many)
