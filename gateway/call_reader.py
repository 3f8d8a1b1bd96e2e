"""Tool calls read as they are written, in a forced mode (`tool_choice` "required" or a named
function), where the grammar makes the output exactly calls in one shape (`json.dumps`'):

    <tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>  (joined by "\\n")

Each call is known by its name as soon as the name is complete, and its arguments grow with the
output, so a stream sends them as they come (OpenAI's way) and a response cut by max_tokens keeps
the call it cut, its arguments as far as they got. Anything out of that shape marks the reader
`lost`: its caller then reads the finished text as a whole instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wire.hermes import CALL_ARGUMENTS, CALL_NAME, TOOL_CLOSE, TOOL_OPEN

NAME_OPEN, NAME_CLOSE, CALL_END = CALL_NAME, CALL_ARGUMENTS, "}" + TOOL_CLOSE
MAX_NAME = 64


@dataclass
class Reading:
    name: str
    arguments: str = ""
    done: bool = False  # the call's closing tag was read


@dataclass
class CallReader:
    calls: list[Reading] = field(default_factory=list)
    lost: bool = False
    _pending: str = ""
    _phase: str = "open"  # open -> name -> arguments -> close -> (next) open
    _depth: int = 0
    _in_string: bool = False
    _escaped: bool = False

    @property
    def open(self) -> bool:
        """Whether the text so far ends inside a call or its opening."""
        return self._phase != "open" or bool(self._pending.strip())

    def feed(self, text: str) -> list[tuple[int, str | None, str]]:
        """What `text` adds: (call index, its name once it is known, else None; arguments
        text). A name comes once, before any of its call's arguments."""
        if self.lost:
            return []
        self._pending += text
        out: list[tuple[int, str | None, str]] = []
        while not self.lost and self._step(out):
            pass
        return out

    def _step(self, out: list[tuple[int, str | None, str]]) -> bool:
        """One phase's worth of the pending text, if it has arrived; whether to go on."""
        if self._phase == "open":
            literal = ("\n" if self.calls else "") + TOOL_OPEN + NAME_OPEN
            return self._expect(literal, "name")
        if self._phase == "name":
            end = self._pending.find(NAME_CLOSE)
            if end < 0:
                self.lost = len(self._pending) > MAX_NAME + len(NAME_CLOSE)
                return False
            name, self._pending = self._pending[:end], self._pending[end + len(NAME_CLOSE):]
            self.calls.append(Reading(name))
            out.append((len(self.calls) - 1, name, ""))
            self._phase = "arguments"
            return True
        if self._phase == "arguments":
            return self._arguments(out)
        if self._expect(CALL_END, "open"):
            self.calls[-1].done = True
            return True
        return False

    def _expect(self, literal: str, then: str) -> bool:
        if not self._pending.startswith(literal[:len(self._pending)]):
            self.lost = True
            return False
        if len(self._pending) < len(literal):
            return False
        self._pending, self._phase = self._pending[len(literal):], then
        return True

    def _arguments(self, out: list[tuple[int, str | None, str]]) -> bool:
        """The arguments' JSON object up to where it closes (strings may hold braces)."""
        if not self.calls[-1].arguments and self._pending[:1] not in ("", "{"):
            self.lost = True  # arguments are an object
            return False
        taken = 0
        for char in self._pending:
            taken += 1
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._phase = "close"
                    break
        piece, self._pending = self._pending[:taken], self._pending[taken:]
        if piece:
            self.calls[-1].arguments += piece
            out.append((len(self.calls) - 1, None, piece))
        return self._phase == "close"
