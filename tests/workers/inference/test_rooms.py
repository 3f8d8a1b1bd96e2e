"""Cache layers with room to grow: what they hold is what concatenation would hold, a token is
written in place, and only a full room (or keys set from outside) is copied."""

from __future__ import annotations

import torch

from workers.inference.rooms import ROOM, RoomyCache, RoomyLayer


def states(rows: int, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2, tokens, 8, generator=g), torch.randn(rows, 2, tokens, 8,
                                                                      generator=g)


def test_a_layer_holds_what_concatenation_holds_and_writes_a_token_in_place() -> None:
    layer, keys, values = RoomyLayer(), *states(3, 10, 0)
    layer.update(keys, values)
    room = layer.keys.data_ptr()
    for step in range(ROOM):
        k, v = states(3, 1, step + 1)
        got_k, got_v = layer.update(k, v)
        keys, values = torch.cat([keys, k], dim=-2), torch.cat([values, v], dim=-2)
        assert torch.equal(got_k, keys) and torch.equal(got_v, values)
    assert layer.keys.data_ptr() == room  # 10 + 64 positions fit the first room (10 + 64)
    assert layer.get_seq_length() == 10 + ROOM
    layer.update(*states(3, 1, 99))  # the room is full: a larger one
    assert layer.keys.data_ptr() != room and layer.room[0].shape[-2] == 75 + ROOM
    assert torch.equal(layer.keys[:, :, :10 + ROOM], keys)


def test_keys_set_from_outside_are_taken_into_a_room_of_their_own() -> None:
    layer = RoomyLayer()
    layer.update(*states(3, 10, 0))
    layer.batch_select_indices(torch.tensor([2, 0]))  # as a batch keeps some of its rows
    kept_k, kept_v = layer.keys.clone(), layer.values.clone()
    k, v = states(2, 1, 1)
    got_k, got_v = layer.update(k, v)
    assert torch.equal(got_k, torch.cat([kept_k, k], dim=-2))
    assert torch.equal(got_v, torch.cat([kept_v, v], dim=-2))
    assert layer.room[0].shape[0] == 2


def test_a_cache_begins_with_its_states_and_grows_layers_as_a_model_asks() -> None:
    kv = [states(2, 5, seed) for seed in range(3)]
    cache = RoomyCache(kv)
    assert cache.get_seq_length() == 5 and len(cache.layers) == 3
    assert all(torch.equal(layer.keys, k) for layer, (k, _) in zip(cache.layers, kv, strict=True))
    empty = RoomyCache()
    empty.update(*states(1, 4, 7), layer_idx=1)
    assert [type(layer) for layer in empty.layers] == [RoomyLayer, RoomyLayer]
    assert empty.layers[1].get_seq_length() == 4
