"""A fused group's gradients go to the executor in parts, each copied into its columns of the
call's memory (the join is never made): the same result as the joined call's and the layers' own
products, on every transport; where a handle cannot take parts, or they exceed one call, they
are joined first."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from wire.call.messages import CallKind, LayerKind, Op
from workers.remote import layers
from workers.remote.client import ExecutorClient
from workers.remote.layers import remote_rows
from workers.remote.parts import Parts

MODEL = "tiny-llama"
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


class Recording:
    """A real client, noting what each call's input came as."""

    def __init__(self, client: ExecutorClient, takes_parts: bool) -> None:
        self.client, self.takes_parts, self.calls = client, takes_parts, []

    def __getattr__(self, name: str):
        return getattr(self.client, name)

    def call(self, op: Op, layer: int, x, kind: CallKind) -> torch.Tensor:
        self.calls.append((op, layer, type(x).__name__, x.shape[0]))
        return self.client.call(op, layer, x, kind)

    @property
    def inputs(self) -> list[tuple[str, int]]:
        return [(kind, rows) for _, _, kind, rows in self.calls]


def mlp_group(client: ExecutorClient):
    """The first gate/up group's spec and its weights joined [256, 64] (the plain model's)."""
    spec = next(s for s in client.layers if s.kind == LayerKind.GROUP and "gate" in s.name)
    mlp = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL)).model.layers[0].mlp
    return spec, torch.cat([mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()])


def test_parts_go_into_their_columns_as_the_join_would() -> None:
    generator = torch.Generator().manual_seed(0)
    parts = Parts([torch.randn(3, width, generator=generator) for width in (2, 5, 4)])
    assert parts.shape == (3, 11) and parts.numel() == 33 and parts.is_floating_point()
    joined = torch.cat(parts.tensors, dim=1)
    assert torch.equal(parts.joined(), joined)
    out = torch.zeros(3, 11, dtype=torch.bfloat16)
    parts.copy_into(out)
    assert torch.equal(out, joined.to(torch.bfloat16))


@pytest.mark.parametrize("options", [{}, {"use_doorbell": False}, {"use_shm": False}])
def test_a_call_in_parts_equals_the_joined_call_on_every_transport(executor_for,
                                                                   options: dict) -> None:
    client = ExecutorClient(executor_for(MODEL).endpoint, name="parts", **options)
    try:
        spec, weight = mlp_group(client)
        generator = torch.Generator().manual_seed(1)
        grads = [torch.randn(5, width, generator=generator) for width in spec.splits]
        joined = client.call(Op.BACKWARD, spec.index, torch.cat(grads, 1),
                             CallKind.TRAINING).clone()
        parted = client.call(Op.BACKWARD, spec.index, Parts(grads), CallKind.TRAINING)
        assert torch.equal(parted, joined)
        assert torch.allclose(parted, torch.cat(grads, 1) @ weight, atol=1e-5)
    finally:
        client.close()


@pytest.mark.parametrize("device", DEVICES)
def test_the_groups_backward_sends_its_gradients_in_parts_where_the_handle_takes_them(
        client_on, device: str, monkeypatch) -> None:
    client = client_on(device, "parts-rows")
    spec, weight = mlp_group(client)
    generator = torch.Generator().manual_seed(2)
    grads = [torch.randn(2, 3, width, generator=generator).to(device) for width in spec.splits]
    expected = (torch.cat(grads, -1).cpu() @ weight).reshape(6, 64)
    for takes, call_bytes, seen in ((True, layers.MAX_CALL_BYTES, [("Parts", 6)]),
                                    (False, layers.MAX_CALL_BYTES, [("Tensor", 6)]),
                                    (True, 4 * 256 * 4, [("Tensor", 4), ("Tensor", 2)])):
        monkeypatch.setattr(layers, "MAX_CALL_BYTES", call_bytes)  # 4 rows a call: chunked
        handle = Recording(client, takes)
        parts = Parts([g.reshape(6, -1) for g in grads])
        out = remote_rows(handle, Op.BACKWARD, spec.index, parts, CallKind.TRAINING, 64,
                          torch.float32)
        assert handle.inputs == seen
        assert out.device.type == device and out.shape == (6, 64)
        assert torch.allclose(out.cpu(), expected, atol=1e-5)


def test_a_training_backward_sends_each_groups_gradients_in_parts(client_on) -> None:
    from workers.remote.build import remote_model

    handle = Recording(client_on("cpu", "parts-step"), True)
    model = remote_model(MODEL, handle, train_stretch_rows=0)  # per projection, not stretches
    embeds = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    model(inputs_embeds=embeds).logits.sum().backward()
    groups = {s.index for s in handle.layers if s.kind == LayerKind.GROUP}
    backward = {(layer, kind) for op, layer, kind, _ in handle.calls if op == Op.BACKWARD}
    assert groups and {layer for layer, _ in backward} >= groups
    assert {kind for layer, kind in backward if layer in groups} == {"Parts"}
    plain = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL))
    again = embeds.detach().clone().requires_grad_()
    plain(inputs_embeds=again).logits.sum().backward()
    assert torch.allclose(embeds.grad, again.grad, rtol=1e-4, atol=1e-5)
