"""A trainer's client (`background=True`): every call reaches the executor as a training call,
the model's no-grad passes too (a job's evaluation, its gates' greedy completions), so they queue
behind tenants' inference and travel with the jobs' training calls; the results are the same."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from tests.helpers import calls_by_kind
from workers.remote.build import remote_model

MODEL = "tiny-llama"


@pytest.mark.parametrize("background", [False, True], ids=["tenant", "trainer"])
def test_no_grad_calls_are_training_calls_only_for_a_background_client(executor_for,
                                                                       background: bool) -> None:
    endpoint = executor_for(MODEL).endpoint
    plain = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL))
    ours = remote_model(MODEL, endpoint, background=background, client_name="background")
    ids = torch.tensor([[11, 400, 7, 9000]])
    try:
        before = calls_by_kind(endpoint)
        with torch.no_grad():
            logits = ours(ids).logits
            tokens = ours.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=3, pad_token_id=0)
        inference, training = (after - first for after, first in
                               zip(calls_by_kind(endpoint), before, strict=True))
    finally:
        ours.symbiosis_executor.close()
    if background:
        assert inference == 0 and training > 0, (inference, training)
    else:
        assert inference > 0 and training == 0, (inference, training)
    with torch.no_grad():
        torch.testing.assert_close(logits, plain(ids).logits, rtol=0, atol=1e-5)
        assert torch.equal(tokens, plain.generate(ids, attention_mask=torch.ones_like(ids),
                                                  do_sample=False, max_new_tokens=3,
                                                  pad_token_id=0))
