"""The decode scenario's shared worker (bench/shared_worker.py): each request of a round goes
through its own adapter (its text is plain transformers + peft's with that adapter alone), every
token is counted, and a closed window cuts the round short."""

from __future__ import annotations

import time

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.models import FIXED_LENGTH
from bench.shared_worker import SharedWorker
from catalogue.resolve import resolve_model
from executor.local import LocalExecutor

MODEL = "tiny-llama"


def plain_text(path, prompt: list[int], tokens: int, tokenizer) -> str:
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(resolve_model(MODEL)), path).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=tokens, **FIXED_LENGTH)
    return tokenizer.decode(out[0, len(prompt):])


def test_each_row_of_a_round_goes_through_its_own_adapter(tmp_path) -> None:
    worker = SharedWorker(MODEL, LocalExecutor.load(MODEL), 3, tmp_path / "adapters")
    rng = torch.Generator().manual_seed(0)
    gaps = worker.serve_round(prompt=5, tokens=6, until=time.monotonic() + 600, rng=rng)
    assert len(gaps) == 3 * 6 and all(g >= 0 for g in gaps)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    texts = [plain_text(path, worker.prompts[request_id], 6, tokenizer)
             for path, request_id in zip(worker.paths, worker.prompts, strict=True)]
    assert list(worker.texts.values()) == texts
    assert len(set(texts)) == 3  # three adapters, three different continuations


def test_decode_ends_with_the_window_not_with_its_last_round(tmp_path) -> None:
    worker = SharedWorker(MODEL, LocalExecutor.load(MODEL), 2, tmp_path / "adapters")
    started = time.monotonic()
    gaps, last = worker.decode(prompt=4, tokens=2000, until=started + 1.0,
                               rng=torch.Generator().manual_seed(0))
    assert last >= started + 1.0
    assert 2 < len(gaps) < 2 * 2000  # the round of two 2,000-token requests was cut short
    assert not any(e.has_work() for e in worker.adapters.engines())
