"""Incremental detokenization: the text handed out token by token is the tokenizer's decoding of
the whole sequence, characters split across tokens included, while each token decodes a window
of a few tokens, not the sequence so far."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from workers.inference.detok import Detokenizer

TEXTS = ["Grüße aus Köln — 東京タワー 🗼🚀 naïve café",
         "plain ascii, then emoji 👩\u200d👩\u200d👧 and \U0001d518\U0001d52b\U0001d526",  # 4 bytes
         "<|im_start|>x", " leading space\n\ttabs  and  runs"]


class Counting:
    """The real tokenizer, counting how many ids each decode is given."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.sizes: list[int] = []

    def decode(self, ids: list[int], **kw) -> str:
        self.sizes.append(len(ids))
        return self.tokenizer.decode(ids, **kw)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model("tiny-llama"))


def streamed(tokenizer, ids: list[int], stop: list[str] | None = None) -> str:
    detok = Detokenizer(tokenizer, stop or [])
    text = "".join(detok.add(token) for token in ids if not detok.stopped)
    return text + detok.flush()


@pytest.mark.parametrize("seed", range(6))
def test_the_streamed_text_is_the_whole_sequences_decoding(tokenizer, seed: int) -> None:
    rng = random.Random(seed)
    ids: list[int] = []
    special = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    for _ in range(40):  # real text's tokens (multi-byte characters split), random ids, specials
        kind = rng.random()
        if kind < 0.5:
            ids += tokenizer.encode(rng.choice(TEXTS), add_special_tokens=False)
        elif kind < 0.9:
            ids += [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 6))]
        else:
            ids.append(rng.choice(special))
    ids += tokenizer.encode(" end.", add_special_tokens=False)  # the whole ends whole
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    assert "\ufffd" not in whole[-5:]
    assert streamed(tokenizer, ids) == whole
    assert len(whole) > 200 and len(ids) > 150


def test_a_sequence_ending_inside_a_character_ends_as_its_whole_decoding(tokenizer) -> None:
    """Cut off by max_tokens in the middle of a multi-byte character: the streamed text ends in
    the replacement characters the whole sequence's decoding gives (was: the bytes dropped)."""
    ids = tokenizer.encode("naïve 🚀🗼 東京", add_special_tokens=False)
    cut = [n for n in range(1, len(ids) + 1)
           if tokenizer.decode(ids[:n], skip_special_tokens=True).endswith("\ufffd")]
    assert len(cut) >= 3  # the emoji and the CJK characters split across tokens
    for n in cut:
        whole = tokenizer.decode(ids[:n], skip_special_tokens=True)
        assert streamed(tokenizer, ids[:n]) == whole
        assert streamed(tokenizer, ids[:n], ["\ufffd"]) == whole[:whole.index("\ufffd")]


def test_each_token_decodes_a_few_tokens_not_the_sequence(tokenizer) -> None:
    ids = tokenizer.encode("word " * 400, add_special_tokens=False)
    counting = Counting(tokenizer)
    assert streamed(counting, ids) == "word " * 400
    assert max(counting.sizes) <= 2 and len(counting.sizes) == 2 * len(ids)


def test_a_stop_string_across_tokens_ends_the_text_before_it(tokenizer) -> None:
    ids = tokenizer.encode("Grüße aus Köln, 東京タワー and more", add_special_tokens=False)
    assert streamed(tokenizer, ids, ["Köln, 東"]) == "Grüße aus "
    assert streamed(tokenizer, ids, ["タワ"]) == "Grüße aus Köln, 東京"
    assert streamed(tokenizer, ids, ["nowhere"]) == "Grüße aus Köln, 東京タワー and more"
