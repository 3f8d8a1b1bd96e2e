"""Stretch calls (a decoder layer's frozen part after attention as one executor call) against
plain transformers + peft, through a real executor process: exact whichever adapter decides
whether they apply, and one call per layer instead of four when they do; a decode step's logits
come with the last stretch unless an adapter touches the head, and (Llama-style models) the first
layer's q/k/v come with the embedding (the lead) unless an adapter touches the embedding; a
greedy step's last call brings the next step's lead too (one call per layer a token). Training
takes the stretches too, on a CPU the kept ones, on a GPU (gpu-marked) the recomputing ones."""

from __future__ import annotations

import pytest
import torch

from tests.peft_reference import TOLERANCE, batch, build_pair, compare
from wire.call.messages import Op
from workers.remote.client import ExecutorClient

LAYERS = 2  # every tiny model has two decoder layers


GREEDY = {"do_sample": False, "eos_token_id": None}  # exactly max_new_tokens, no processors


def per_token_calls(model, client: ExecutorClient, tokens: int = 6) -> float:
    """Calls a greedy decode step makes, after the first (which follows the prompt's head)."""
    ids = batch(1)[:1]
    with torch.no_grad():
        model.generate(input_ids=ids, max_new_tokens=2, **GREEDY)
        before = client.calls
        model.generate(input_ids=ids, max_new_tokens=2, **GREEDY)
        first = client.calls - before
        before = client.calls
        model.generate(input_ids=ids, max_new_tokens=tokens + 2, **GREEDY)
    return (client.calls - before - first) / tokens


@pytest.mark.parametrize(("model", "method", "stretched", "tail", "lead"), [
    ("tiny-llama", "lora_qv", True, True, True), ("tiny-qwen2", "lora_qv", True, True, True),
    ("tiny-gpt2", "lora_qv", True, True, False), ("tiny-llama", "lora_qv_head", True, False, True),
    ("tiny-gpt2", "ia3", False, False, False), ("tiny-llama", "lora", False, False, True),
    ("tiny-llama", "ia3", False, False, True), ("tiny-llama", "lora_embed", True, True, False),
])
def test_exact_either_way_and_one_call_per_layer_when_untouched(model: str, method: str,
                                                                  stretched: bool, tail: bool,
                                                                  lead: bool,
                                                                  executor_for) -> None:
    client = ExecutorClient(executor_for(model).endpoint, name=f"stretch-{model}-{method}")
    try:
        # a CPU executor's training takes the (kept) stretches for batches up to 64 rows
        result = compare(model, method, client, train_stretch_rows=64)
        assert max(result["logits"], result["grads"], result["params"]) <= TOLERANCE, result
        assert result["generate_equal"], result
        plain, ours = build_pair(model, method, client, seed=3, train_stretch_rows=64)
        plain.eval()
        ours.eval()
        ids = batch(4)
        with torch.no_grad():
            before = client.calls
            logits = ours(input_ids=ids).logits
            forward_calls = client.calls - before
            torch.testing.assert_close(logits, plain(input_ids=ids).logits, rtol=0,
                                       atol=TOLERANCE)
        embeddings = 2 if model == "tiny-gpt2" else 1  # GPT-2: token and position tables
        per_projection = embeddings + 4 * LAYERS + 1
        expected = embeddings + 1 + LAYERS + 1 if stretched else per_projection
        # a prompt: the head is called for itself; the lead brings the first q/k/v; a greedy
        # step's last call the next step's lead (with a tail and a lead: greedy calls)
        assert forward_calls == expected - lead
        assert per_token_calls(ours, client) == expected - lead - tail - (tail and lead)
        greedy = ours.get_base_model().model.embed_tokens.symbiosis_lead if tail and lead \
            else None
        before = list(greedy.choices) if greedy is not None else []
        with torch.no_grad():  # every decode step's logits, not only the greedy choice
            steps = [m.generate(input_ids=ids, max_new_tokens=5, min_new_tokens=5,
                                do_sample=False, output_logits=True,
                                return_dict_in_generate=True).logits for m in (plain, ours)]
        for theirs, mine in zip(*steps, strict=True):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=TOLERANCE)
        if greedy is not None:  # 4 decode steps: the last 3 began with what the one before
            assert greedy.choices == [before[0] + 3, before[1]]  # brought (exact, above)
        ours.train()
        before = client.calls
        ours(input_ids=ids, labels=ids).loss.backward()
        # backward: lm_head, then each stretch (or each layer's 4 projections but the first
        # q/k/v, whose input, the embeddings, needs no gradient unless an adapter trains them)
        backward = (1 + LAYERS if stretched else 4 * LAYERS) + (method == "lora_embed")
        assert client.calls - before == expected + backward
    finally:
        client.close()


@pytest.mark.parametrize("kept", [True, False])
def test_training_through_kept_or_recomputing_stretches_matches_plain_peft(kept: bool,
                                                                          executor_for) -> None:
    """A CPU executor's training takes the kept stretches (their forward hands back what the
    backward needs: `executor.kept`); a GPU one's the stretches whose backward recomputes it.
    Both exact against plain peft, here on a CPU, each layer's backward one call to its own."""
    client = ExecutorClient(executor_for("tiny-llama").endpoint, name=f"stretch-kept-{kept}")
    try:
        result = compare("tiny-llama", "lora_qv", client, train_kept=kept)
        assert max(result["logits"], result["grads"], result["params"]) <= TOLERANCE, result
        _, ours = build_pair("tiny-llama", "lora_qv", client, seed=3, train_kept=kept)
        ours.train()
        names = {s.index: s.name for s in client.layers}
        called: list[tuple[str, int]] = []
        call = client.call
        client.call = lambda op, layer, x, kind: called.append((names[layer], op)) or call(
            op, layer, x, kind)
        ids = batch(4)
        ours(input_ids=ids, labels=ids).loss.backward()
        suffix = "+kept" if kept else ""
        expected = [(f"model.layers.{i}.stretch{suffix}", op) for op in (Op.FORWARD, Op.BACKWARD)
                    for i in range(LAYERS)]
        assert sorted(c for c in called if ".stretch" in c[0]) == sorted(expected)
    finally:
        client.close()


def test_a_stretch_stays_out_of_the_way_of_an_adapter_added_later(executor_for) -> None:
    """Adapters wrap the model after it was built: the stretch notices at call time."""
    from peft import LoraConfig, get_peft_model

    from workers.remote.build import remote_model

    client = ExecutorClient(executor_for("tiny-llama").endpoint, name="stretch-late")
    try:
        model = remote_model("tiny-llama", client).eval()
        ids = batch(5)
        with torch.no_grad():
            before = client.calls
            base = model(input_ids=ids).logits
            assert client.calls - before == 4  # lead, 2 stretches, head
            wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["o_proj"])).eval()
            before = client.calls
            same = wrapped(input_ids=ids).logits  # LoRA B is zero: the same logits
            assert client.calls - before == 9  # lead, then per projection but q/k/v 0
        torch.testing.assert_close(same, base, rtol=0, atol=TOLERANCE)
    finally:
        client.close()


def test_a_layer_output_changed_in_place_by_a_hook_is_normed_here_again(executor_for) -> None:
    """A stretch brings the next layer's normed input and q/k/v for the output it returned; a
    forward hook that changes that output in place makes both stale: the next layer computes
    its own (as the plain model with the same hook does)."""
    from transformers import AutoModelForCausalLM

    from catalogue.resolve import resolve_model
    from workers.remote.build import remote_model

    client = ExecutorClient(executor_for("tiny-llama").endpoint, name="stretch-hooked")
    try:
        ours = remote_model("tiny-llama", client).eval()
        plain = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama")).eval()
        for model in (ours, plain):  # the embedding (the lead's) and layer 0's output
            model.model.layers[0].register_forward_pre_hook(lambda m, args: args[0].mul_(2.0))
            model.model.layers[0].register_forward_hook(lambda m, args, out: out.mul_(1.5))
        ids = batch(6)
        with torch.no_grad():
            mine, theirs = ours(input_ids=ids).logits, plain(input_ids=ids).logits
        torch.testing.assert_close(mine, theirs, rtol=0, atol=TOLERANCE)
    finally:
        client.close()


def test_q_changed_in_place_leaves_the_staged_k_and_v_usable(executor_for) -> None:
    """peft's mixed-adapter batches add to q in place; q, k, v and the norm that keys them came
    in one result, and the k and v must still go to their layers without calls of their own."""
    from workers.remote.build import remote_model

    client = ExecutorClient(executor_for("tiny-llama").endpoint, name="stretch-inplace")
    try:
        model = remote_model("tiny-llama", client).eval()
        plain_calls = per_token_calls(model, client)
        for layer in model.model.layers:
            layer.self_attn.q_proj.register_forward_hook(lambda m, args, out: out.mul_(1.0))
        assert per_token_calls(model, client) == plain_calls == LAYERS
    finally:
        client.close()


def test_a_staged_result_goes_only_to_its_input_or_a_view_of_all_of_it() -> None:
    from workers.remote.layers import Stage

    stage, x, y = Stage(), torch.randn(2, 1, 4), torch.randn(2, 1, 3)
    stage.put(x, y)
    assert stage.take(x) is y
    stage.put(x, y)
    assert stage.take(x[:, -1:, :]) is y  # a model's last position of a one-position step
    assert stage.take(x) is None  # taken once
    longer = torch.randn(2, 3, 4)
    stage.put(longer, y)
    assert stage.take(longer[:, -1:, :]) is None  # part of it: not what was computed
    stage.put(x, y)
    assert stage.take(x.clone()) is None  # equal values, another tensor
    stage.put(x, y)
    x.add_(1)
    assert stage.take(x) is None  # changed since
    result = torch.randn(2, 1, 10)  # a stretch's result: the norm staged is a part of it
    normed = result[..., 3:7]
    stage.put(normed, y)
    assert stage.take(normed[:, -1:, :]) is y
    stage.put(normed, y)
    assert stage.take(result[..., 2:6]) is None  # another part of the same result


def test_the_lead_turns_itself_off_where_the_first_layer_never_takes_its_q_k_v(
        executor_for) -> None:
    """Prompt tuning puts virtual tokens before the embeddings, so the first layer's input is
    never the embedding the lead brought: after a few wasted leads it stays off, exact
    throughout (a model whose first layer takes them keeps it: the call counts above)."""
    from workers.remote.lead import MAX_MISSES

    client = ExecutorClient(executor_for("tiny-llama").endpoint, name="lead-prompt-tuning")
    try:
        plain, ours = build_pair("tiny-llama", "prompt_tuning", client, seed=4)
        plain.eval()
        ours.eval()
        lead = ours.get_base_model().model.embed_tokens.symbiosis_lead
        ids = batch(6)
        with torch.no_grad():
            for _ in range(MAX_MISSES + 1):
                torch.testing.assert_close(ours(input_ids=ids).logits,
                                           plain(input_ids=ids).logits, rtol=0, atol=TOLERANCE)
        assert not lead.enabled and lead.misses == MAX_MISSES
        calls = client.calls
        with torch.no_grad():
            ours(input_ids=ids)
        assert client.calls - calls == 1 + 1 + LAYERS + 1  # embedding, q/k/v 0, stretches, head
    finally:
        client.close()


def test_a_sampled_token_other_than_the_greedy_choice_gets_its_own_lead(executor_for) -> None:
    """Sampling rarely takes the greedy choice: the lead the last call brought for it goes
    unused and the lead is called for the token taken, exact against the plain model with the
    same random draws."""
    from transformers import AutoModelForCausalLM

    from catalogue.resolve import resolve_model
    from workers.remote.build import remote_model

    client = ExecutorClient(executor_for("tiny-llama").endpoint, name="greedy-sampled")
    try:
        ours = remote_model("tiny-llama", client).eval()
        plain = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama")).eval()
        lead = ours.model.embed_tokens.symbiosis_lead
        sample = {"do_sample": True, "temperature": 5.0, "top_k": 0, "eos_token_id": None,
                  "max_new_tokens": 24, "output_logits": True, "return_dict_in_generate": True}
        runs = []
        with torch.no_grad():
            for model in (plain, ours):
                torch.manual_seed(11)
                before = client.calls
                runs.append(model.generate(input_ids=batch(1)[:1], **sample))
        calls = client.calls - before
        assert torch.equal(runs[0].sequences, runs[1].sequences)
        for theirs, mine in zip(runs[0].logits, runs[1].logits, strict=True):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=TOLERANCE)
        # 23 decode steps, each choice brought and not taken (the last one's never looked at)
        assert lead.choices == [0, 22]
        assert calls == 1 + LAYERS + 1 + 23 * (1 + LAYERS)  # the prompt, then the steps
    finally:
        client.close()


@pytest.mark.gpu
def test_training_on_a_gpu_takes_the_stretches_and_matches_plain_peft(client_on) -> None:
    """A CUDA worker of a CUDA executor trains through the stretches by default (batches up to
    `TRAIN_MAX_ROWS["cuda"]` rows): each layer's frozen part one autograd node with one backward
    call, exact against plain peft on the same device."""
    client = client_on("cuda", "stretch-train-cuda")
    result = compare("tiny-llama", "lora_qv", client, device="cuda")
    assert max(result["logits"], result["grads"], result["params"]) <= TOLERANCE, result
    assert result["generate_equal"], result
    _, ours = build_pair("tiny-llama", "lora_qv", client, seed=3, device="cuda")
    ours.train()
    ids = batch(4).to("cuda")
    before = client.calls
    ours(input_ids=ids, labels=ids).loss.backward()
    # forward: the embedding, the first q/k/v, a stretch a layer, the head; backward: the head,
    # then a stretch a layer (per projection it would be 10 and 8 calls)
    assert client.calls - before == (1 + 1 + LAYERS + 1) + (1 + LAYERS)
