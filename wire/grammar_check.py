"""An output constraint as the gateway hands it to a worker: an llguidance grammar that not
only validates but builds. `LLMatcher.validate_grammar` does not build the grammar: one past
llguidance's own limits (65,525 grammar symbols, e.g. an object of ~11,000 properties)
validates, then breaks the worker's matcher with a panic and a backtrace. Its symbols do not
depend on the tokenizer, so the gateway builds a long grammar against a byte-level one (no
model needed; building validates it too) and refuses it first; the worker words the same
failure the same way."""

from __future__ import annotations

from functools import cache

from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper

BUILT_FROM = 16 * 1024  # characters: shorter grammars are far from the limits (and cheap to
# build in the worker, where a failure is still the request's clean 400)


class _Bytes:
    """A tokenizer of the 256 bytes and an end."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([byte]) for byte in range(256)] + [b"</s>"]
    special_token_ids = [256]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


@cache
def _byte_tokenizer() -> LLTokenizer:
    return LLTokenizer(TokenizerWrapper(_Bytes()))


def refusal(grammar: str) -> str | None:
    """Why the grammar cannot be used (None: it can): validated, or, a long one, built (which
    validates it as well, with the same messages: it is not read twice)."""
    if len(grammar) < BUILT_FROM:
        failed, messages = LLMatcher.validate_grammar_with_warnings(grammar)
        return messages[0] if failed else None
    matcher = LLMatcher(_byte_tokenizer(), grammar, log_level=0)
    return worded(matcher.get_error()) if matcher.is_error() else None


def worded(error: str) -> str:
    """llguidance's error for a client: a panic (a limit reached) in one line, without its
    backtrace; any other as llguidance says it."""
    said = error.strip() or "unknown error"
    if said.startswith("panic:"):
        first = said.splitlines()[0].removeprefix("panic:").strip()
        return (f"the constraint is too large for the grammar engine (llguidance: {first}); "
                "make the schema smaller")
    return said
