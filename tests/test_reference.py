"""The reference itself: plain peft's cached greedy generate() equals greedy decoding by full
forwards without a cache, for every PEFT method the exactness tests compare against. When a
transformers release breaks peft's cache handling (5.24 did, for prefix and prompt tuning with
peft 0.21.2: the first generated token already differed), this test names the cause, and the
exactness tests' failures are the reference's, not ours."""

from __future__ import annotations

import pytest
import torch

from executor.local import LocalExecutor
from tests.peft_reference import METHODS, build_pair

MODEL = "tiny-llama"


@pytest.mark.parametrize("method", METHODS)
def test_cached_generate_equals_uncached_greedy_decoding(method: str) -> None:
    plain, _ = build_pair(MODEL, method, LocalExecutor.load(MODEL))
    plain.eval()
    ids = torch.randint(0, 50000, (1, 5), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = plain.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=6, min_new_tokens=6, do_sample=False)
        tokens = ids
        for _ in range(6):
            logits = plain(input_ids=tokens, attention_mask=torch.ones_like(tokens),
                           use_cache=False).logits
            tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert out[0, 5:].tolist() == tokens[0, 5:].tolist()
