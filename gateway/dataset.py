"""Validation of fine-tuning JSONL, line by line, with messages that name the line.

Two formats: chat (`{"messages": [...]}`, the loss is taken on assistant messages) and
prompt/completion (`{"prompt": str, "completion": str}`, the loss is on the completion). One
file holds one format. Torch-free: token counts use the base model's `tokenizers` tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
MESSAGE_KEYS = {"role", "content", "name", "function_call", "weight", "tool_calls",
                "tool_call_id"}
MAX_REPORTED = 10
PER_MESSAGE_TOKENS = 4  # role marker, newline, end marker


@dataclass
class Report:
    format: str | None = None  # chat | prompt_completion
    examples: int = 0
    tokens: int = 0
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def message(self) -> str:
        shown = self.errors[:MAX_REPORTED]
        more = len(self.errors) - len(shown)
        text = "Invalid fine-tuning file: " + "; ".join(shown)
        if more:
            text += f"; and {more} more problem(s)"
        if self.warnings:
            text += ". Warnings: " + "; ".join(self.warnings[:MAX_REPORTED])
        return text


def validate_jsonl(data: bytes | Iterable[bytes],
                   count_tokens: Callable[[str], int] | None = None,
                   max_tokens: int = 0) -> Report:
    """`data`: the file's bytes, or its lines as bytes (a file read line by line: an upload
    is never held in memory whole)."""
    report = Report()
    lines = data.splitlines(keepends=True) if isinstance(data, bytes) else data
    with_system, without_system, offset = 0, [], 0
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            report.errors.append(f"the file is not UTF-8 text (byte {offset + exc.start})")
            return report
        offset += len(raw)
        if not line.strip():
            continue
        problem, fmt, tokens, has_system = _check_line(line, count_tokens)
        if problem is None and report.format is not None and fmt != report.format:
            problem = f"is in the {fmt} format, but earlier lines use the {report.format} format"
        if problem is None and max_tokens and tokens > max_tokens:
            problem = f"example is {tokens} tokens, more than the maximum of {max_tokens}"
        if problem is not None:
            report.errors.append(f"line {number}: {problem}")
            continue
        report.format = report.format or fmt
        report.examples += 1
        report.tokens += tokens
        if fmt == "chat":
            if has_system:
                with_system += 1
            else:
                without_system.append(number)
    if report.examples == 0 and not report.errors:
        report.errors.append("the file has no examples")
    if with_system and without_system:
        report.warnings.extend(f"line {n}: no system message, unlike {with_system} other "
                               "example(s)" for n in without_system)
    return report


def _check_line(line: str, count_tokens) -> tuple[str | None, str, int, bool]:
    try:
        example = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg}; line starts with: {line[:30]!r})", "", 0, False
    if not isinstance(example, dict):
        return (f"not a JSON object (line starts with: {line[:30]!r})", "", 0, False)
    if "messages" in example:
        return _check_chat(example, count_tokens)
    if "prompt" in example or "completion" in example:
        return _check_prompt_completion(example, count_tokens)
    return "needs a 'messages' list, or 'prompt' and 'completion'", "", 0, False


def _check_chat(example: dict, count_tokens) -> tuple[str | None, str, int, bool]:
    extra = set(example) - {"messages", "tools", "parallel_tool_calls", "functions"}
    if extra:
        return f"unrecognized key(s) {sorted(extra)}", "chat", 0, False
    messages = example["messages"]
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list", "chat", 0, False
    tokens, roles = 0, []
    for i, message in enumerate(messages, start=1):
        if not isinstance(message, dict):
            return f"message {i} is not an object", "chat", 0, False
        if "role" not in message:
            return f"message {i} has no 'role'", "chat", 0, False
        if message["role"] not in ROLES:
            return f"message {i} has an unrecognized role {message['role']!r}", "chat", 0, False
        unknown = set(message) - MESSAGE_KEYS
        if unknown:
            return f"message {i} has unrecognized key(s) {sorted(unknown)}", "chat", 0, False
        if "weight" in message and message["weight"] not in (0, 1):
            return f"message {i} has a weight other than 0 or 1", "chat", 0, False
        content = _text(message.get("content"))
        if content is None:
            return f"message {i} has no text content", "chat", 0, False
        roles.append(message["role"])
        tokens += PER_MESSAGE_TOKENS + (count_tokens(content) if count_tokens else 0)
    if "user" not in roles:
        return "example has no user message", "chat", 0, False
    if "assistant" not in roles:
        return "example has no assistant message", "chat", 0, False
    return None, "chat", tokens, roles[0] in ("system", "developer")


def _check_prompt_completion(example: dict, count_tokens) -> tuple[str | None, str, int, bool]:
    fmt = "prompt_completion"
    extra = set(example) - {"prompt", "completion"}
    if extra:
        return f"unrecognized key(s) {sorted(extra)}", fmt, 0, False
    for key in ("prompt", "completion"):
        if not isinstance(example.get(key), str):
            return f"'{key}' must be a string", fmt, 0, False
    if not example["completion"].strip():
        return "'completion' is empty", fmt, 0, False
    tokens = count_tokens(example["prompt"] + example["completion"]) if count_tokens else 0
    return None, fmt, tokens, False


def _text(content: object) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return None
