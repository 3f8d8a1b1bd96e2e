"""Fine-tuning file validation: real data passes, defects are named by line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from catalogue.resolve import resolve_model
from gateway.dataset import validate_jsonl

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture(scope="module")
def count():
    tokenizer = Tokenizer.from_file(str(resolve_model("tiny-llama") / "tokenizer.json"))
    return lambda text: len(tokenizer.encode(text).ids)


def test_gsm8k_chat_and_prompt_completion_files_pass(count) -> None:
    chat = validate_jsonl((DATA / "gsm8k_train_chat_1000.jsonl").read_bytes(), count, 2048)
    assert chat.ok and chat.format == "chat" and chat.examples == 1000 and chat.tokens > 50_000
    pc = validate_jsonl((DATA / "gsm8k_train_prompt_completion_1000.jsonl").read_bytes(),
                        count, 2048)
    assert pc.ok and pc.format == "prompt_completion" and pc.examples == 1000


def test_the_cookbook_toy_file_is_rejected_line_by_line(count) -> None:
    report = validate_jsonl((DATA / "openai_cookbook_toy_chat_fine_tuning.jsonl").read_bytes(),
                            count, 2048)
    assert not report.ok
    message = report.message()
    assert "line 4: example has no user message" in message
    assert "line 5: example is" in message and "more than the maximum of 2048" in message
    assert "line 3: no system message" in message
    assert "line 1" not in message and "line 2" not in message


@pytest.mark.parametrize(("data", "expected"), [
    (b"", "the file has no examples"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[1, 2]\n", "line 1: not a JSON object"),
    (b'{"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]}',
     "line 1: message 2 has an unrecognized role 'bot'"),
    (b'{"messages": [{"role": "user", "content": "a"}]}', "line 1: example has no assistant"),
    (b'{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b",'
     b' "mood": "x"}]}', "unrecognized key(s) ['mood']"),
    (b'{"prompt": "a", "completion": 3}', "line 1: 'completion' must be a string"),
    (b'{"prompt": "a", "completion": "b"}\n{"messages": [{"role": "user", "content": "a"}, '
     b'{"role": "assistant", "content": "b"}]}', "line 2: is in the chat format, but earlier"),
    (b'{"text": "hello"}', "line 1: needs a 'messages' list"),
    (b'{"messages": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", "line 1: nested too deeply"),
    (b'{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b",'
     b' "weight": 0}]}', "line 1: example has nothing to learn from: every assistant message"),
    (b'{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}'
     b'\nnot json', "line 2: not valid JSON"),
])
def test_junk_is_rejected_with_a_line_specific_message(data: bytes, expected: str) -> None:
    report = validate_jsonl(data)
    assert not report.ok
    assert expected in report.message()


def test_content_parts_and_weights_are_accepted() -> None:
    line = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                         {"role": "assistant", "content": "x", "weight": 0},
                         {"role": "user", "content": "again"},
                         {"role": "assistant", "content": "y", "weight": 1}]}
    assert validate_jsonl(json.dumps(line).encode()).ok


def test_a_byte_order_mark_before_the_first_line_is_no_defect(count) -> None:
    """Some editors save UTF-8 with a BOM; one before any later line is still refused."""
    lines = (DATA / "gsm8k_train_chat_1000.jsonl").read_bytes().splitlines(keepends=True)[:3]
    marked = validate_jsonl(b"\xef\xbb\xbf" + b"".join(lines), count, 2048)
    plain = validate_jsonl(b"".join(lines), count, 2048)
    assert marked.ok and (marked.examples, marked.tokens) == (plain.examples, plain.tokens) == \
        (3, plain.tokens)
    inside = validate_jsonl(lines[0] + b"\xef\xbb\xbf" + lines[1], count, 2048)
    assert not inside.ok and "line 2: not valid JSON" in inside.message()
