"""Incremental detokenization with stop strings.

Text is emitted as soon as it is final: not while the last token ends in the middle of a UTF-8
character, and not while its tail could still be the start of a stop string. Each token decodes
a window of a few tokens, not the whole sequence (which cost a token O(length): at 2,000
tokens, a third of a millisecond each): the new text is what the window decodes to past what
its first part decoded to, as in vLLM. The first part gives a token the context a tokenizer
may need (SentencePiece drops a sequence's leading space), and the window starts where the
text was whole before, so a character split across tokens is read whole.
"""

from __future__ import annotations

from typing import Any


class Detokenizer:
    def __init__(self, tokenizer: Any, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.prefix = 0  # where the decoding window starts: its first part, already read...
        self.read = 0  # ...ends here; the ids after it are new
        self.text = ""  # all decoded text so far
        self.emitted = 0  # characters of `text` already handed out
        self.stopped = False

    def add(self, token: int) -> str:
        """Append a token; return the newly final text (may be empty)."""
        self.ids.append(token)
        if not self._read(final=False):
            return ""  # wait for the rest of the character
        return self._emit_until_stop(len(self.text) - self._held_back())

    def flush(self) -> str:
        """The rest of the text, when the sequence ends without a stop string: a character its
        last tokens leave unfinished as decoding the whole sequence gives it (U+FFFD)."""
        if self.stopped:
            return ""
        if self.read < len(self.ids):
            self._read(final=True)
        return self._emit_until_stop(len(self.text))

    def _read(self, final: bool) -> bool:
        """Decode the window's new ids into `text`, unless they end in the middle of a
        character (and the sequence goes on: not `final`); whether it did."""
        read = self.tokenizer.decode(self.ids[self.prefix:self.read], skip_special_tokens=True)
        window = self.tokenizer.decode(self.ids[self.prefix:], skip_special_tokens=True)
        if window.endswith("\ufffd") and not final:
            return False
        self.text += window[len(read):]
        self.prefix, self.read = self.read, len(self.ids)
        return True

    def _emit_until_stop(self, end: int) -> str:
        """The text up to `end`, or up to a stop string that the new text completed."""
        start = max(0, self.emitted - max((len(s) for s in self.stop), default=0))
        cut = min((i for s in self.stop if (i := self.text.find(s, start)) >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return self._emit(cut)
        return self._emit(end)

    def _held_back(self) -> int:
        """Length of the longest tail of the pending text that begins some stop string."""
        pending = self.text[self.emitted:]
        best = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(pending)), best, -1):
                if stop.startswith(pending[-n:]):
                    best = n
                    break
        return best

    def _emit(self, end: int) -> str:
        end = max(end, self.emitted)
        piece = self.text[self.emitted:end]
        self.emitted = end
        return piece
