"""The tail's greedy call when a decode step's rows all take their greedy choice (`Choosing`):
the choices come from the executor, the logits stay in the call's memory, and the next step
goes on from the lead the call brought; exact against plain transformers + peft, through an
executor process on each device."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from tests.peft_reference import TOLERANCE, batch, build_pair
from wire import manager as W
from workers.inference.engine import InferenceEngine
from workers.inference.request import Request
from workers.remote.tail import Choosing, Tail, tail_of

MODEL = "tiny-llama"
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def tail_widths(monkeypatch) -> list[tuple[int, ...]]:
    """Each tail call's logits as its step gets them, (rows, width), from now on."""
    widths = []
    real = Tail.run

    def run(self, last, rows):
        parts = real(self, last, rows)
        widths.append(tuple(parts[2].shape))
        return parts
    monkeypatch.setattr(Tail, "run", run)
    return widths


def run_all(engine: InferenceEngine, requests: list[Request]) -> dict[str, list]:
    """Each request's events, the engine stepped until it has no work."""
    events: dict[str, list] = {r.id: [] for r in requests}
    for request in requests:
        assert engine.add(request) == []
    while engine.has_work():
        for event in engine.step():
            events[event.id].append(event)
    return events


@pytest.mark.parametrize("device", DEVICES)
def test_a_choosing_step_brings_the_greedy_choices_and_no_logits(device: str, client_on) -> None:
    """A decode step of two rows inside `Choosing`: empty logits, plain transformers' argmax as
    its ids; the step after it starts from the lead that call brought, its logits plain's."""
    plain, ours = build_pair(MODEL, "lora_qv", client_on(device, f"choosing-{device}"),
                             device=device)
    plain, ours = plain.to(device).eval(), ours.eval()
    tail = tail_of(ours)
    lead = ours.get_base_model().model.embed_tokens.symbiosis_lead
    ids = batch(5).to(device)
    with torch.no_grad():
        mine, theirs = ours(input_ids=ids, use_cache=True), plain(input_ids=ids, use_cache=True)
        first = theirs.logits[:, -1:].argmax(-1)
        theirs = plain(input_ids=first, past_key_values=theirs.past_key_values, use_cache=True)
        with Choosing(tail, True) as chosen:
            mine = ours(input_ids=first, past_key_values=mine.past_key_values, use_cache=True)
        assert mine.logits.shape == (2, 1, 0) and tail.choosing is None
        second = theirs.logits[:, -1].argmax(-1)
        assert chosen.ids == second.tolist()
        taken = lead.choices[0]
        theirs = plain(input_ids=second[:, None], past_key_values=theirs.past_key_values,
                       use_cache=True)
        mine = ours(input_ids=second[:, None], past_key_values=mine.past_key_values,
                    use_cache=True)
    assert lead.choices[0] == taken + 1  # the third step began with what the second brought
    torch.testing.assert_close(mine.logits, theirs.logits, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("device", DEVICES)
def test_steps_of_greedy_rows_alone_skip_the_logits_and_decode_as_plain_generate(
        device: str, client_on, monkeypatch) -> None:
    """Two greedy requests beside a sampled one: the steps with the sampled row bring every
    row's logits, the steps after it leaves only the choices; the greedy texts are plain
    generate()'s, the sampled request gets its tokens."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    plain, ours = build_pair(MODEL, "lora_qv", client_on(device, f"greedy-rows-{device}"),
                             device=device)
    plain = plain.to(device).eval()
    widths = tail_widths(monkeypatch)
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=(), max_batch=8)
    prompts = [list(range(40, 49)), list(range(7, 16)), list(range(90, 99))]
    greedy = W.SamplingParams(max_tokens=8, temperature=0)
    sampled = W.SamplingParams(max_tokens=3, temperature=1.0, seed=5)
    requests = [Request("a", prompts[0], greedy), Request("s", prompts[1], sampled),
                Request("b", prompts[2], greedy)]
    events = run_all(engine, requests)
    vocab = plain.config.vocab_size
    assert widths == [(3, vocab)] * 2 + [(2, 0)] * 5  # 1 token from the prefill, then steps
    for request in (requests[0], requests[2]):
        ids = torch.tensor([request.prompt_ids], device=device)
        with torch.no_grad():
            out = plain.generate(input_ids=ids, max_new_tokens=8, min_new_tokens=8,
                                 do_sample=False, attention_mask=torch.ones_like(ids))
        expected = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        assert "".join(e.text for e in events[request.id] if isinstance(e, W.Delta)) == expected
    done = [e for e in events["s"] if isinstance(e, W.Done)]
    assert done and done[0].completion_tokens == 3


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_rows_that_may_not_end_yet_take_their_best_other_token_in_either_kind_of_step(
        device: str, client_on, monkeypatch) -> None:
    """Greedy requests that may not end yet (`ignore_eos`; `min_tokens` as long as they are)
    beside a sampled one: where a row's best token is an end of sequence, its shared argmax is
    settled from the step's logits (a's second token, while the sampled row brings them) or from
    those the executor's greedy call left in its memory (b's fifth, after it: the steps still
    bring only the choices); each text is plain generate()'s with those ends suppressed."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    plain, ours = build_pair(MODEL, "lora_qv", client_on(device, f"early-{device}"),
                             device=device)
    plain = plain.to(device).eval()
    widths = tail_widths(monkeypatch)

    def generate(prompt: list[int], **ends) -> list[int]:
        ids = torch.tensor([prompt], device=device)
        with torch.no_grad():
            out = plain.generate(input_ids=ids, max_new_tokens=8, min_new_tokens=8,
                                 do_sample=False, attention_mask=torch.ones_like(ids), **ends)
        return out[0, ids.shape[1]:].tolist()

    prompts = [list(range(40, 49)), list(range(7, 16)), list(range(90, 99))]
    free = [generate(prompts[0]), generate(prompts[2])]  # their choices where they may end
    eos = (free[0][1], free[1][4])
    assert not set(eos) & {free[0][0], *free[1][:4]}  # the ends come first where said
    engine = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=eos, max_batch=8)
    requests = [Request("a", prompts[0], W.SamplingParams(max_tokens=8, temperature=0,
                                                          ignore_eos=True)),
                Request("s", prompts[1], W.SamplingParams(max_tokens=3, temperature=1.0, seed=5)),
                Request("b", prompts[2], W.SamplingParams(max_tokens=8, temperature=0,
                                                          min_tokens=8))]
    events = run_all(engine, requests)
    vocab = plain.config.vocab_size
    assert widths == [(3, vocab)] * 2 + [(2, 0)] * 5  # greedy calls once the sampled row left
    for request, tokens in zip((requests[0], requests[2]), free, strict=True):
        expected = generate(request.prompt_ids, eos_token_id=list(eos))
        assert expected != tokens
        text = "".join(e.text for e in events[request.id] if isinstance(e, W.Delta))
        assert text == tokenizer.decode(expected, skip_special_tokens=True)
