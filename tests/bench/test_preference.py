"""The benchmark's DPO pairs (`bench.preference`): from GSM8K's chat file, each question's own
answer preferred over the next question's; with a history, the conversation opens with the
exchanges before it in the file, rendered by the tokenizer's chat template."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

import workers.training.preference
from bench.preference import preference_pairs
from bench.workload import CHAT_DATA
from catalogue.resolve import resolve_model
from workers.training.data import IGNORE


@pytest.mark.parametrize("history", [0, 3])
def test_each_pair_is_a_question_its_answer_and_the_next_ones(monkeypatch,
                                                              history: int) -> None:
    monkeypatch.setattr(workers.training.preference, "remember_references",
                        lambda *args, **kwargs: None)  # their values: tests/workers/training
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny-llama"))
    pairs = preference_pairs(None, tokenizer, CHAT_DATA, 0, 4096, count=5, history=history)
    with CHAT_DATA.open() as f:
        chats = [json.loads(next(f))["messages"] for _ in range(6)]
    assert len(pairs) == 5
    for k, one in enumerate(pairs):
        earlier = [message for chat in chats[max(0, k - history):k] for message in chat]
        prompt = [*earlier, *chats[k][:-1]]
        for example, answer in ((one.preferred, chats[k][-1]), (one.non_preferred,
                                                                chats[k + 1][-1])):
            whole = tokenizer.apply_chat_template([*prompt, answer], tokenize=True,
                                                  return_dict=False)
            assert example.ids == list(whole)
            trained = [label for label in example.labels if label != IGNORE]
            assert answer["content"] in tokenizer.decode(trained)
            assert not any(m["content"] in tokenizer.decode(trained) for m in earlier
                           if m["role"] == "user")
