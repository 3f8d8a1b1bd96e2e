"""The fine-tuning file format (OpenAI's JSONL), read in one place: the gateway checks an upload
with it line by line, the trainer reads the examples it tokenizes with it. Torch-free.

Three formats: chat (`{"messages": [...]}`, the loss is on assistant messages, `weight` 0 leaves
one out; tools and tool calls as the model is served them, `training_tools`),
prompt/completion (`{"prompt": str, "completion": str}`, the loss is on the
completion) and preference, for DPO (`{"input": {"messages": [...], "tools": [...]},
"preferred_output": [message], "non_preferred_output": [message]}`, one assistant message
each). One file holds one format.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from state.training_tools import BadTools, assistant_text, check_calls, tools_of
from wire.hermes import tool_response, with_tools

ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
MESSAGE_KEYS = {"role", "content", "name", "function_call", "weight", "tool_calls",
                "tool_call_id"}


@dataclass(frozen=True)
class Turn:
    role: str
    text: str
    weight: int = 1  # 0: not learned from (assistant messages)
    name: str = ""  # the participant's, where the example names one (a template may show it)


@dataclass(frozen=True)
class Chat:
    turns: tuple[Turn, ...]
    format = "chat"

    @property
    def has_system(self) -> bool:
        return self.turns[0].role in ("system", "developer")


@dataclass(frozen=True)
class PromptCompletion:
    prompt: str
    completion: str
    format = "prompt_completion"


@dataclass(frozen=True)
class Preference:
    prompt: tuple[Turn, ...]  # the conversation the outputs answer (its assistant turns: weight 0)
    preferred: Turn
    non_preferred: Turn
    format = "preference"


Example = Chat | PromptCompletion | Preference
PREFERENCE_KEYS = {"input", "preferred_output", "non_preferred_output"}


class BadLine(ValueError):
    """What is wrong with one line (`format`: the format it tried to be, if any)."""

    def __init__(self, problem: str, format: str = "") -> None:
        super().__init__(problem)
        self.format = format


class NotText(ValueError):
    def __init__(self, offset: int) -> None:
        super().__init__(f"the file is not UTF-8 text (byte {offset})")


def lines(data: bytes | Iterable[bytes]) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line; NotText at the first byte that is not UTF-8.
    `data`: the file's bytes or its lines (a file read line by line is never held whole)."""
    offset = 0
    for number, raw in enumerate(data.splitlines(keepends=True) if isinstance(data, bytes)
                                 else data, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NotText(offset + exc.start) from None
        offset += len(raw)
        if number == 1:
            line = line.removeprefix("\ufeff")  # a byte order mark, as some editors save
        if line.strip():
            yield number, line


def parse(line: str) -> Example:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BadLine(f"not valid JSON ({exc.msg}; line starts with: {line[:30]!r})") from None
    except RecursionError:
        raise BadLine(f"nested too deeply to read (line starts with: {line[:30]!r})") from None
    if not isinstance(record, dict):
        raise BadLine(f"not a JSON object (line starts with: {line[:30]!r})")
    if "messages" in record:
        return _chat(record)
    if "prompt" in record or "completion" in record:
        return _prompt_completion(record)
    if PREFERENCE_KEYS & set(record):
        return _preference(record)
    raise BadLine("needs a 'messages' list, 'prompt' and 'completion', or 'input', "
                  "'preferred_output' and 'non_preferred_output'")


def _chat(record: dict) -> Chat:
    extra = set(record) - {"messages", "tools", "parallel_tool_calls", "functions"}
    if extra:
        raise BadLine(f"unrecognized key(s) {sorted(extra)}", "chat")
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise BadLine("'messages' must be a non-empty list", "chat")
    try:
        tools = tools_of(record)
        turns = [_turn(i, message) for i, message in enumerate(messages, start=1)]
        check_calls(messages, tools)
    except BadTools as exc:
        raise BadLine(str(exc), "chat") from None
    roles = {turn.role for turn in turns}
    if "user" not in roles:
        raise BadLine("example has no user message", "chat")
    if "assistant" not in roles:
        raise BadLine("example has no assistant message", "chat")
    if all(t.weight == 0 for t in turns if t.role == "assistant"):
        raise BadLine("example has nothing to learn from: every assistant message has weight 0",
                      "chat")
    return Chat(_with_tools(turns, tools))


def _with_tools(turns: list[Turn], tools: list[dict]) -> tuple[Turn, ...]:
    """The turns with the tools listed in the system message, as a served request's are."""
    if tools:
        if turns[0].role in ("system", "developer"):
            turns[0] = replace(turns[0], text=with_tools(turns[0].text, tools))
        else:
            turns.insert(0, Turn("system", with_tools(None, tools)))
    return tuple(turns)


def _preference(record: dict) -> Preference:
    fmt = Preference.format
    if set(record) != PREFERENCE_KEYS:
        raise BadLine(f"needs exactly the keys {sorted(PREFERENCE_KEYS)} (has "
                      f"{sorted(record)})", fmt)
    given = record["input"]
    if not isinstance(given, dict) or not isinstance(given.get("messages"), list) or \
            not given["messages"]:
        raise BadLine("'input' must be an object with a non-empty 'messages' list", fmt)
    extra = set(given) - {"messages", "tools", "parallel_tool_calls", "functions"}
    if extra:
        raise BadLine(f"'input' has unrecognized key(s) {sorted(extra)}", fmt)
    messages = given["messages"]
    outputs = [_output(record, key, len(messages) + 1)
               for key in ("preferred_output", "non_preferred_output")]
    try:
        tools = tools_of(given)
        turns = [_turn(i, message) for i, message in enumerate(messages, start=1)]
        answers = [_turn(len(messages) + 1, output) for output in outputs]
        for output in outputs:
            check_calls([*messages, output], tools)
    except (BadTools, BadLine) as exc:  # a message's problem, in this format
        raise BadLine(str(exc), fmt) from None
    if "user" not in {turn.role for turn in turns}:
        raise BadLine("example has no user message", fmt)
    preferred, non_preferred = answers
    if preferred.text == non_preferred.text:
        raise BadLine("the preferred and non-preferred outputs are the same: nothing to learn",
                      fmt)
    prompt = [replace(turn, weight=0) if turn.role == "assistant" else turn for turn in turns]
    return Preference(_with_tools(prompt, tools), preferred, non_preferred)


def _output(record: dict, key: str, i: int) -> dict:
    output = record[key]
    if not isinstance(output, list) or len(output) != 1 or not isinstance(output[0], dict) or \
            output[0].get("role") != "assistant":
        raise BadLine(f"'{key}' must be a list of one assistant message (message {i})",
                      Preference.format)
    return output[0]


def _turn(i: int, message: object) -> Turn:
    if not isinstance(message, dict):
        raise BadLine(f"message {i} is not an object", "chat")
    if "role" not in message:
        raise BadLine(f"message {i} has no 'role'", "chat")
    if message["role"] not in ROLES:
        raise BadLine(f"message {i} has an unrecognized role {message['role']!r}", "chat")
    unknown = set(message) - MESSAGE_KEYS
    if unknown:
        raise BadLine(f"message {i} has unrecognized key(s) {sorted(unknown)}", "chat")
    if "weight" in message and message["weight"] not in (0, 1):
        raise BadLine(f"message {i} has a weight other than 0 or 1", "chat")
    text = _text(message.get("content"))
    role = message["role"]
    if ("tool_calls" in message or "function_call" in message) and role != "assistant":
        raise BadLine(f"message {i} has tool calls, which only an assistant message makes",
                      "chat")
    if role == "assistant":
        text = assistant_text(i, message, text)
    if text is None:
        raise BadLine(f"message {i} has no text content", "chat")
    if role in ("tool", "function"):  # a result, as the model reads it (a function's name
        return Turn("tool", tool_response(text))  # is the call's, not a participant's)
    name = message.get("name", "")
    if not isinstance(name, str):
        raise BadLine(f"message {i} has a name that is not a string", "chat")
    return Turn(role, text, int(message.get("weight", 1)), name)


def _prompt_completion(record: dict) -> PromptCompletion:
    fmt = PromptCompletion.format
    extra = set(record) - {"prompt", "completion"}
    if extra:
        raise BadLine(f"unrecognized key(s) {sorted(extra)}", fmt)
    for key in ("prompt", "completion"):
        if not isinstance(record.get(key), str):
            raise BadLine(f"'{key}' must be a string", fmt)
    if not record["completion"].strip():
        raise BadLine("'completion' is empty", fmt)
    return PromptCompletion(record["prompt"], record["completion"])


def _text(content: object) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return None
