# ruff: noqa: F811  (the fixtures imported from test_adapters are arguments here)
"""A worker's adapter budget (in-process executor): the memory resident adapters hold, and one
tenant's share of it in a shared worker; what goes is the least recently used idle adapter
(the tenant's own, for its share), and every request still equals plain peft."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file

from tests.workers.inference.test_adapters import (  # noqa: F401  (fixtures)
    adapters,
    plain_tokens,
    saved,
    serve,
    tokenizer,
)
from wire import manager as W


def file_bytes(path: Path) -> int:
    """The adapter's tensors as its file holds them (float32, as the model)."""
    return sum(t.numel() * t.element_size()
               for t in load_file(path / "adapter_model.safetensors").values())


def assert_exact(got: dict[str, list[int]], asks, tokenizer) -> None:
    for request_id, _, path in asks:
        prompt = tokenizer.encode(f"request {request_id} says")
        assert got[request_id] == tokenizer.encode(tokenizer.decode(
            plain_tokens(path, prompt))), request_id


def test_resident_adapters_stay_within_the_memory_budget(saved, tokenizer) -> None:
    models = ["t/lora-a@1", "t/lora-b@1", "t/lora-qv@1"]
    sizes = {model: file_bytes(saved[model]) for model in models}
    assert sizes["t/lora-qv@1"] < sizes["t/lora-a@1"]  # two shapes, two sizes
    held = adapters(tokenizer, bytes=sum(sizes.values()) - 1)
    for model in models:
        serve(held, [(model, model, saved[model])], tokenizer)
    assert {m: a.bytes for m, a in held.loaded.items()} == \
        {m: sizes[m] for m in ("t/lora-b@1", "t/lora-qv@1")}  # a@1, the oldest, went
    asks = [("a", "t/lora-a@1", saved["t/lora-a@1"]), ("qv", "t/lora-qv@1", saved["t/lora-qv@1"])]
    assert_exact(serve(held, asks, tokenizer), asks, tokenizer)
    assert sorted(held.loaded) == ["t/lora-a@1", "t/lora-qv@1"]  # b went for a@1: b's place
    assert sum(a.bytes for a in held.loaded.values()) <= held.budget.bytes
    cache = held.cache("w")  # what the worker tells its manager
    assert (cache.resident, cache.bytes, cache.loads, cache.let_go) == \
        (2, sizes["t/lora-a@1"] + sizes["t/lora-qv@1"], 4, 2)


def test_a_tenant_past_its_share_lets_go_of_its_own_adapters(saved, tokenizer) -> None:
    """beta's adapter is the least recently used, but acme is past its share: acme's second
    adapter takes the place of acme's first, and beta's stays."""
    one = file_bytes(saved["t/lora-a@1"])
    held = adapters(tokenizer, tenant_bytes=one)
    for tenant, model in (("beta", "t/lora-b@1"), ("acme", "t/lora-a@1"), ("acme", "t/lora-a@2")):
        held.route(model, W.AdapterRef(str(saved[model]), ""), tenant)
    assert {m: a.tenant for m, a in held.loaded.items()} == {"t/lora-b@1": "beta",
                                                             "t/lora-a@2": "acme"}
    assert len(held.peft.peft_config) == 2  # a@2 loaded over a@1
    asks = [("b", "t/lora-b@1", saved["t/lora-b@1"]), ("a2", "t/lora-a@2", saved["t/lora-a@2"])]
    assert_exact(serve(held, asks, tokenizer), asks, tokenizer)
    held.route("t/lora-qv@1", W.AdapterRef(str(saved["t/lora-qv@1"]), ""), "acme")  # no place
    assert sorted(held.loaded) == ["t/lora-b@1", "t/lora-qv@1"]
