"""Which prompts share a prefill forward: similar lengths only (padding is computed too); a
shared forward of several adapters' prompts against plain transformers + peft."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from peft import get_peft_model
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from executor.local import LocalExecutor
from tests.peft_reference import peft_config
from workers.inference.prefill import PADDING_SHARE, groups, prefill_together
from workers.inference.rows import RowAdapters
from workers.remote.build import remote_model

MODEL = "tiny-llama"


def test_prompts_of_similar_lengths_share_a_forward_and_a_long_one_goes_alone() -> None:
    assert groups([12, 9, 5, 3]) == [[0, 1], [2, 3]]  # 12+9 of 24; 5+3 of 10
    assert groups([10, 10, 10, 10]) == [[0, 1, 2, 3]]
    assert groups([2000, 10, 12, 11]) == [[0], [2, 3, 1]]  # never 8,000 tokens for 2,033
    for lengths in ([12, 9, 5, 3], [2000, 10, 12, 11], [7, 1, 7, 2, 6, 30, 29]):
        found = groups(lengths)
        assert sorted(i for g in found for i in g) == list(range(len(lengths)))
        for group in found:
            width = max(lengths[i] for i in group)
            padding = len(group) * width - sum(lengths[i] for i in group)
            assert padding <= PADDING_SHARE * len(group) * width, (lengths, group)


def test_prompts_sharing_a_forward_keep_their_own_adapters_on_the_last_mlp() -> None:
    """Three prompts (one padded) of an adapter on every projection, one on q/v and the base
    model in one prefill forward: the last MLP takes each prompt's last position, the batch's
    rows as the rows' adapters take them (`workers.remote.kept_rows`), and each prompt's
    logits are plain peft's with its adapter alone."""
    ours = get_peft_model(remote_model(MODEL, LocalExecutor.load(MODEL)),
                          peft_config(MODEL, "lora"), adapter_name="all")
    plain = get_peft_model(AutoModelForCausalLM.from_pretrained(resolve_model(MODEL)),
                           peft_config(MODEL, "lora"), adapter_name="all")
    for model in (ours, plain):
        model.add_adapter("qv", peft_config(MODEL, "lora_qv"))
        model.eval()
    generator, theirs = torch.Generator().manual_seed(3), dict(plain.named_parameters())
    with torch.no_grad():
        for name, parameter in ours.named_parameters():
            if "lora_" in name:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
                theirs[name].copy_(parameter)
    shapes = []
    ours.get_base_model().model.layers[-1].mlp.gate_proj.register_forward_hook(
        lambda module, args, out: shapes.append(tuple(args[0].shape[:2])))
    prompts, adapters = [[5, 6, 7, 8, 9, 10], [20, 21, 22, 23, 24], [30, 31, 32, 33, 34, 35]], \
        ["all", "qv", None]
    with torch.no_grad():  # as the engine's step runs
        filled = prefill_together(ours, RowAdapters(ours), prompts, adapters,
                                  torch.device("cpu"))
    assert shapes == [(3, 1)]
    for prompt, adapter, done in zip(prompts, adapters, filled, strict=True):
        with torch.no_grad(), plain.disable_adapter() if adapter is None else nullcontext():
            if adapter is not None:
                plain.set_adapter(adapter)
            logits = plain(input_ids=torch.tensor([prompt])).logits[0, -1]
        torch.testing.assert_close(done.last_logits, logits, rtol=1e-5, atol=1e-5)
