"""A tenant's adapters in one worker (in-process executor): LoRA adapters of different ranks and
targets, two IA3 adapters, prefix and prompt tuning and the base model served together; each
request's tokens equal plain transformers + peft with that adapter alone."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from catalogue.resolve import resolve_model
from executor.local import LocalExecutor
from tests.peft_reference import save_adapters
from wire import manager as W
from workers.inference.adapters import AdapterLoadError, Adapters
from workers.inference.budget import Budget
from workers.inference.engine import InferenceEngine
from workers.inference.request import Request
from workers.remote.build import remote_model

MODEL = "tiny-llama"
GREEDY = W.SamplingParams(max_tokens=8, temperature=0)
ADAPTERS = {"t/lora-a@1": ("lora", 1), "t/lora-b@1": ("lora", 2), "t/lora-qv@1": ("lora_qv", 3),
            "t/lora-a@2": ("lora", 4), "t/ia3@1": ("ia3", 5), "t/prefix@1": ("prefix_tuning", 6),
            "t/ia3@2": ("ia3", 7), "t/prompt@1": ("prompt_tuning", 8), "t/ia3@3": ("ia3", 9)}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(MODEL))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    return save_adapters(tmp_path_factory, MODEL, ADAPTERS)


def plain_tokens(path: Path | None, prompt: list[int], device: str = "cpu") -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL)).to(device)
    if path is not None:
        model = PeftModel.from_pretrained(model, path, torch_device=device)
    ids = torch.tensor([prompt], device=device)
    with torch.no_grad():
        out = model.eval().generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                    max_new_tokens=8, min_new_tokens=8, do_sample=False)
    return out[0, len(prompt):].tolist()


def adapters(tokenizer, capacity: int = 32, chunk_tokens: int = 0, executor=None,
             device: str = "cpu", **budget: int) -> Adapters:
    """A worker's adapters over `executor` (an in-process one unless given), its models and
    adapters on `device`."""
    executor = executor or LocalExecutor.load(MODEL)

    def engine(model):
        return InferenceEngine(model, tokenizer, max_context=2048, eos_ids=(), max_batch=16,
                               chunk_tokens=chunk_tokens)

    def base():
        return remote_model(MODEL, executor, device=device)

    return Adapters(base(), engine, base, device=device, budget=Budget(capacity, **budget))


def serve(adapters: Adapters, asks: list[tuple[str, str | None, Path | None]],
          tokenizer) -> dict[str, list[int]]:
    """Add every (request id, model, adapter path) at once, step every engine until done; each
    request's generated token ids."""
    for request_id, model, path in asks:
        ref = None if path is None else W.AdapterRef(str(path), "")
        engine, adapter = adapters.route(model or "base", ref)
        prompt = tokenizer.encode(f"request {request_id} says")
        prefill = adapters.prefill_of(model or "base")
        assert engine.add(Request(request_id, prompt, GREEDY, adapter=adapter,
                                  prefill=prefill)) == []
    deltas: dict[str, list[str]] = {request_id: [] for request_id, _, _ in asks}
    while any(e.has_work() for e in adapters.engines()):
        for engine in adapters.engines():
            for event in engine.step() if engine.has_work() else []:
                assert not isinstance(event, W.Failed), event
                if isinstance(event, W.Delta):  # (of requests added before too)
                    deltas.setdefault(event.id, []).append(event.text)
    return {rid: tokenizer.encode("".join(parts)) for rid, parts in deltas.items()}


def test_one_worker_serves_many_adapters_in_one_batch_exactly(saved, tokenizer) -> None:
    held = adapters(tokenizer)
    asks = [(f"r{i}", model, saved[model]) for i, model in enumerate(ADAPTERS)]
    asks += [("base", None, None), ("r0-again", "t/lora-a@1", saved["t/lora-a@1"])]
    got = serve(held, asks, tokenizer)
    for request_id, model, path in asks:
        prompt = tokenizer.encode(f"request {request_id} says")
        expected = tokenizer.encode(tokenizer.decode(plain_tokens(path, prompt)))
        assert got[request_id] == expected, (request_id, model)
    shared = [a for a in held.loaded.values() if a.shared and a.group is None]
    assert sorted(a.model for a in shared) == ["t/lora-a@1", "t/lora-a@2", "t/lora-b@1",
                                               "t/lora-qv@1"]
    assert all(a.engine is held.engine for a in shared)  # the LoRA rows share one engine
    ia3 = [held.loaded[m] for m in ("t/ia3@1", "t/ia3@2")]
    assert ia3[0].engine is ia3[1].engine and ia3[0].shared  # the IA3 rows another
    prompts = [held.loaded[m] for m in ("t/prefix@1", "t/prompt@1")]
    assert all(a.prefill is not None and a.engine is held.engine for a in prompts)
    assert len(held.engines()) == 2  # prompt and prefix tuning: their prompt, then base rows
    assert len({*got["r0"]}) > 1 and got["r0"] != got["r1"] != got["base"]


def test_the_least_recently_used_idle_adapter_goes_and_comes_back(saved, tokenizer) -> None:
    held = adapters(tokenizer, capacity=2)
    for model in ("t/lora-a@1", "t/lora-b@1", "t/lora-qv@1"):
        serve(held, [(model, model, saved[model])], tokenizer)
    assert sorted(held.loaded) == ["t/lora-b@1", "t/lora-qv@1"]
    assert sorted(held.peft.peft_config) == sorted(a.name for a in held.loaded.values())
    got = serve(held, [("again", "t/lora-a@1", saved["t/lora-a@1"])], tokenizer)
    prompt = tokenizer.encode("request again says")
    assert got["again"] == tokenizer.encode(tokenizer.decode(
        plain_tokens(saved["t/lora-a@1"], prompt)))
    assert "t/lora-b@1" not in held.loaded  # the least recently used made room


def test_an_adapter_in_use_is_never_let_go(saved, tokenizer) -> None:
    held = adapters(tokenizer, capacity=1)
    engine, name = held.route("t/lora-a@1", W.AdapterRef(str(saved["t/lora-a@1"]), ""))
    engine.add(Request("busy", [1, 2, 3], GREEDY, adapter=name))
    held.route("t/lora-b@1", W.AdapterRef(str(saved["t/lora-b@1"]), ""))
    held.unload("t/lora-a@1")
    assert "t/lora-a@1" in held.loaded  # waiting for its request
    while engine.has_work():
        engine.step()
    held.settle()
    assert sorted(held.loaded) == ["t/lora-b@1"]


def test_an_adapter_that_does_not_load_fails_alone(saved, tokenizer, tmp_path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text(
        (saved["t/lora-a@1"] / "adapter_config.json").read_text())
    (broken / "adapter_model.safetensors").write_bytes(b"not a tensor file")
    held = adapters(tokenizer)
    for _ in range(2):  # the first LoRA adapter of the worker, then with others loaded
        with pytest.raises(AdapterLoadError):
            held.route("t/broken@1", W.AdapterRef(str(broken), ""))
        assert "t/broken@1" not in held.loaded
        got = serve(held, [("base", None, None), ("a", "t/lora-a@1", saved["t/lora-a@1"])],
                    tokenizer)
        prompt = tokenizer.encode("request base says")
        assert got["base"] == tokenizer.encode(tokenizer.decode(plain_tokens(None, prompt)))


def test_a_batch_of_one_adapter_then_another_switches_exactly(saved, tokenizer) -> None:
    held = adapters(tokenizer)
    serve(held, [("warm", "t/lora-a@1", saved["t/lora-a@1"])], tokenizer)  # a is active now
    asks = [("b1", "t/lora-b@1", saved["t/lora-b@1"]), ("b2", "t/lora-b@1", saved["t/lora-b@1"])]
    for batch in (asks, [("a", "t/lora-a@1", saved["t/lora-a@1"])]):
        got = serve(held, batch, tokenizer)
        for request_id, _, path in batch:
            prompt = tokenizer.encode(f"request {request_id} says")
            assert got[request_id] == tokenizer.encode(tokenizer.decode(
                plain_tokens(path, prompt))), request_id


def test_a_full_worker_loads_an_adapter_over_an_idle_one_of_its_shape(saved, tokenizer) -> None:
    held = adapters(tokenizer, capacity=2)
    serve(held, [("a", "t/lora-a@1", saved["t/lora-a@1"])], tokenizer)
    serve(held, [("b", "t/lora-b@1", saved["t/lora-b@1"])], tokenizer)
    names = {model: held.loaded[model].name for model in held.loaded}
    asks = [("new", "t/lora-a@2", saved["t/lora-a@2"]), ("b", "t/lora-b@1", saved["t/lora-b@1"])]
    got = serve(held, asks, tokenizer)  # a@2 in a@1's place, in one batch with b
    assert held.loaded["t/lora-a@2"].name == names["t/lora-a@1"]
    assert sorted(held.peft.peft_config) == sorted(names.values())  # no module added or removed
    for request_id, _, path in asks:
        prompt = tokenizer.encode(f"request {request_id} says")
        assert got[request_id] == tokenizer.encode(tokenizer.decode(
            plain_tokens(path, prompt))), request_id
    serve(held, [("qv", "t/lora-qv@1", saved["t/lora-qv@1"])], tokenizer)  # another shape
    assert held.loaded["t/lora-qv@1"].name not in names.values()
    assert sorted(held.peft.peft_config) == sorted(a.name for a in held.loaded.values())


def test_a_file_that_lacks_a_tensor_is_refused_and_takes_no_place(saved, tokenizer,
                                                                   tmp_path) -> None:
    """The same config, but a tensor missing from the file: no place fits it, and peft's loader
    (modules made without memory) would serve whatever that memory held: refused, the others
    stay and serve."""
    from safetensors.torch import load_file, save_file

    partial = tmp_path / "partial"
    partial.mkdir()
    source = saved["t/lora-a@2"]
    (partial / "adapter_config.json").write_text((source / "adapter_config.json").read_text())
    tensors = load_file(source / "adapter_model.safetensors")
    dropped = sorted(tensors)[0]
    save_file({k: v for k, v in tensors.items() if k != dropped},
              partial / "adapter_model.safetensors")
    held = adapters(tokenizer, capacity=2)
    for ask in (("a", "t/lora-a@1"), ("b", "t/lora-b@1")):
        serve(held, [(*ask, saved[ask[1]])], tokenizer)
    names = {model: a.name for model, a in held.loaded.items()}
    with pytest.raises(AdapterLoadError, match="lacks 1 of its tensors"):
        held.route("t/partial@1", W.AdapterRef(str(partial), ""))
    assert {model: a.name for model, a in held.loaded.items()} == names  # nothing let go
    assert sorted(held.peft.peft_config) == sorted(names.values())
    got = serve(held, [("a", "t/lora-a@1", saved["t/lora-a@1"])], tokenizer)
    prompt = tokenizer.encode("request a says")
    assert got["a"] == tokenizer.encode(tokenizer.decode(plain_tokens(saved["t/lora-a@1"],
                                                                      prompt)))


def test_ia3_adapters_share_a_group_until_the_last_goes(saved, tokenizer) -> None:
    held = adapters(tokenizer, capacity=2)
    asks = [("i1", "t/ia3@1", saved["t/ia3@1"]), ("i2", "t/ia3@2", saved["t/ia3@2"])]
    got = serve(held, asks, tokenizer)  # one batch, each row scaled by its own adapter
    for request_id, _, path in asks:
        prompt = tokenizer.encode(f"request {request_id} says")
        assert got[request_id] == tokenizer.encode(tokenizer.decode(
            plain_tokens(path, prompt))), request_id
    (group,) = held.groups.groups.values()
    assert sorted(group.peft.peft_config) == sorted(a.name for a in held.loaded.values())
    serve(held, [("a", "t/lora-a@1", saved["t/lora-a@1"])], tokenizer)  # ia3@1 goes
    assert sorted(held.loaded) == ["t/ia3@2", "t/lora-a@1"]
    names = list(group.peft.peft_config)
    assert names == [held.loaded["t/ia3@2"].name]
    got = serve(held, [("i3", "t/ia3@3", saved["t/ia3@3"])], tokenizer)  # in ia3@2's place
    assert sorted(held.loaded) == ["t/ia3@3", "t/lora-a@1"]
    assert list(group.peft.peft_config) == names == [held.loaded["t/ia3@3"].name]
    assert got["i3"] == tokenizer.encode(tokenizer.decode(plain_tokens(
        saved["t/ia3@3"], tokenizer.encode("request i3 says"))))
    held.unload("t/ia3@3")
    assert held.groups.groups == {} and len(held.engines()) == 1


def test_prompt_and_prefix_tuning_decode_as_base_rows_once_prefilled(saved, tokenizer) -> None:
    """Their models over the shared base (made before the LoRA adapters' model here) prefill the
    prompt; the rows then decode with the base model's, so the adapter may go meanwhile."""
    held = adapters(tokenizer, capacity=1)
    engine, name = held.route("t/prefix@1", W.AdapterRef(str(saved["t/prefix@1"]), ""))
    prompt = tokenizer.encode("request early says")
    assert name is None and engine is held.engine
    engine.add(Request("early", prompt, GREEDY, prefill=held.prefill_of("t/prefix@1")))
    first = "".join(e.text for e in engine.step() if isinstance(e, W.Delta))  # prefilled
    assert first and held.loaded["t/prefix@1"].busy() is False
    asks = [("l", "t/lora-a@1", saved["t/lora-a@1"]), ("p", "t/prompt@1", saved["t/prompt@1"]),
            ("b", None, None)]
    got = serve(held, asks, tokenizer)  # the prefix adapter goes, its request decodes on
    assert "t/prefix@1" not in held.loaded and len(held.engines()) == 1
    got["early"] = tokenizer.encode(first + tokenizer.decode(got["early"]))
    for request_id, _, path in [*asks, ("early", None, saved["t/prefix@1"])]:
        expected = tokenizer.encode(tokenizer.decode(plain_tokens(
            path, tokenizer.encode(f"request {request_id} says"))))
        assert got[request_id] == expected, request_id


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("first, second, third", [("t/lora-a@1", "t/lora-b@1", "t/lora-a@2"),
                                                  ("t/ia3@1", "t/ia3@2", "t/ia3@3")])
def test_a_worker_with_room_copies_a_resident_adapters_modules_for_one_of_its_shape(
        saved, tokenizer, caplog, first, second, third, device, client_on) -> None:
    """With room for more, an adapter of a resident one's shape (LoRA, or IA3 in its group) is
    made as a copy of its modules (peft's loader walks the whole model, longer with every
    adapter resident); every row stays exact, also once the adapter it was copied from is
    gone. In-process, and on a GPU worker (copies made on the device) of a GPU executor."""
    held = adapters(tokenizer) if device == "cpu" else adapters(
        tokenizer, device=device, executor=client_on(device, f"clone-{device}"))
    with caplog.at_level(logging.INFO, logger="workers.adapters"):
        got = serve(held, [(m, m, saved[m]) for m in (first, second, third)], tokenizer)
    copied = [r.getMessage() for r in caplog.records if "as a copy of" in r.getMessage()]
    assert copied == [f"adapter {second} made as a copy of {first}'s modules",
                      f"adapter {third} made as a copy of {first}'s modules"]
    held.unload(first)
    held.settle()
    group = held.loaded[second].group
    holder = held.peft if group is None else held.groups.model(group)
    assert first not in held.loaded and sorted(holder.peft_config) == sorted(
        held.loaded[m].name for m in (second, third))
    again = serve(held, [(f"{m}-again", m, saved[m]) for m in (second, third)], tokenizer)
    for model in (first, second, third):
        prompt = tokenizer.encode(f"request {model} says")
        assert got[model] == tokenizer.encode(tokenizer.decode(plain_tokens(saved[model],
                                                                            prompt, device)))
    for model in (second, third):
        prompt = tokenizer.encode(f"request {model}-again says")
        assert again[f"{model}-again"] == tokenizer.encode(tokenizer.decode(
            plain_tokens(saved[model], prompt, device)))
