"""Validation of an uploaded fine-tuning file, line by line, with messages that name the line:
the format as `state.training_file` reads it (the trainer reads it the same way), one format per
file, token counts (the base model's `tokenizers` tokenizer), a warning for uneven system
messages. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from state.training_file import BadLine, Chat, Example, NotText, Preference, lines, parse

MAX_REPORTED = 10
PER_MESSAGE_TOKENS = 4  # role marker, newline, end marker


@dataclass
class Report:
    format: str | None = None  # chat | prompt_completion | preference
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
    with_system, without_system = 0, []
    try:
        for number, line in lines(data):
            try:
                example = parse(line)
            except BadLine as exc:
                report.errors.append(f"line {number}: {exc}")
                continue
            problem, tokens = None, _tokens(example, count_tokens)
            if report.format is not None and example.format != report.format:
                problem = (f"is in the {example.format} format, but earlier lines use the "
                           f"{report.format} format")
            elif max_tokens and tokens > max_tokens:
                problem = f"example is {tokens} tokens, more than the maximum of {max_tokens}"
            if problem is not None:
                report.errors.append(f"line {number}: {problem}")
                continue
            report.format = report.format or example.format
            report.examples += 1
            report.tokens += tokens
            if isinstance(example, Chat):
                if example.has_system:
                    with_system += 1
                else:
                    without_system.append(number)
    except NotText as exc:
        report.errors.append(str(exc))
        return report
    if report.examples == 0 and not report.errors:
        report.errors.append("the file has no examples")
    if with_system and without_system:
        report.warnings.extend(f"line {n}: no system message, unlike {with_system} other "
                               "example(s)" for n in without_system)
    return report


def _tokens(example: Example, count_tokens: Callable[[str], int] | None) -> int:
    """Its tokens (a preference example's: the longer of its two conversations)."""
    if isinstance(example, Preference):
        return max(_tokens(Chat((*example.prompt, answer)), count_tokens)
                   for answer in (example.preferred, example.non_preferred))
    if isinstance(example, Chat):
        return sum(PER_MESSAGE_TOKENS + (count_tokens(turn.text) if count_tokens else 0)
                   for turn in example.turns)
    return count_tokens(example.prompt + example.completion) if count_tokens else 0
