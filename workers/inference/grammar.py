"""Constrained decoding with llguidance: one matcher per sequence, a token mask per step.

The gateway compiles `response_format` and tool schemas into llguidance grammars; here each
sequence of a constrained request gets an `LLMatcher` that says which tokens may come next.
The tokenizer's llguidance twin is built once per worker, on the first constrained request.
"""

from __future__ import annotations

from typing import Any

import llguidance
import llguidance.hf
import torch

from wire.grammar_check import worded

BITS = torch.arange(32, dtype=torch.int32)


class GrammarError(ValueError):
    pass


class Grammars:
    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._lltokenizer: llguidance.LLTokenizer | None = None

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        if self._lltokenizer is None:
            self._lltokenizer = llguidance.hf.from_tokenizer(self.tokenizer,
                                                             n_vocab=self.vocab_size)
        matcher = llguidance.LLMatcher(self._lltokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(worded(matcher.get_error()))
        return matcher

    def allowed(self, matcher: llguidance.LLMatcher) -> torch.Tensor:
        """bool [vocab]: the tokens the grammar allows next (EOS only once it is satisfied)."""
        words = torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.int32)
        return ((words.unsqueeze(1) >> BITS) & 1).flatten()[:self.vocab_size].bool()
