"""A batch's cache layers with room to grow: what they hold is what concatenation would hold,
a token is written in place, and only a full room (or keys set from outside) is copied."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workers.inference.batch import ROOM, BatchCache, RoomyCache, RoomyLayer


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


def test_rows_joining_a_batch_are_written_once_padded_as_before() -> None:
    """A batch of 2 rows at 6 positions joined by 1 row at 9: each left-padded with zeros to 9
    (the padding zeroed even where the room held garbage), the next token written in place."""
    first = [states(2, 6, seed) for seed in range(2)]
    second = [states(1, 9, seed) for seed in range(2, 4)]
    batch = BatchCache()
    batch.join(first, torch.ones(2, 6, dtype=torch.long))
    batch.join(second, torch.ones(1, 9, dtype=torch.long))
    for (k, v), (k0, v0), (k1, v1) in zip(batch.kv, first, second, strict=True):
        assert torch.equal(k, torch.cat([F.pad(k0, (0, 0, 3, 0)), k1]))
        assert torch.equal(v, torch.cat([F.pad(v0, (0, 0, 3, 0)), v1]))
    assert batch.mask.tolist() == [[0] * 3 + [1] * 6] * 2 + [[1] * 9]
    assert batch.starts == (3, 3, 0)
    layer = batch.cache.layers[0]
    room = layer.keys.data_ptr()
    layer.update(*states(3, 1, 9))
    assert layer.keys.data_ptr() == room and layer.get_seq_length() == 10


def test_rows_kept_lose_the_padding_no_row_needs_written_once() -> None:
    batch = BatchCache()
    short, long = [states(2, 6, seed) for seed in range(2)], [states(1, 9, 2 + s) for s in range(2)]
    batch.join(short, torch.ones(2, 6, dtype=torch.long))
    batch.join(long, torch.ones(1, 9, dtype=torch.long))
    batch.sequences = ["a", "b", "long"]
    batch.keep([1, 0])  # the long row leaves: its 3 positions of the others' padding go too
    assert batch.sequences == ["b", "a"] and batch.mask.tolist() == [[1] * 6] * 2
    assert batch.starts == (0, 0)
    for (k, v), (k0, v0) in zip(batch.kv, short, strict=True):
        assert torch.equal(k, k0[[1, 0]]) and torch.equal(v, v0[[1, 0]])
    layer = batch.cache.layers[1]
    room = layer.keys.data_ptr()
    layer.update(*states(2, 1, 9))
    assert layer.keys.data_ptr() == room and layer.get_seq_length() == 7


def test_each_rows_padding_follows_joins_and_keeps() -> None:
    """The leading positions a row does not hold, as `row_attention.plan` reads them."""
    batch = BatchCache()
    batch.join([states(1, 4, 0)], torch.tensor([[0, 1, 1, 1]]))  # a prompt padded in prefill
    assert batch.starts == (1,)
    batch.join([states(1, 7, 1)], torch.ones(1, 7, dtype=torch.long))
    assert batch.starts == (4, 0)
    batch.step_inputs()  # a token more for every row
    assert batch.starts == (4, 0) and batch.mask.shape == (2, 8)
    batch.sequences = ["short", "long"]
    batch.keep([0])  # kept in place: its padding stays (attention skips it)
    assert batch.starts == (4,) and batch.mask.tolist() == [[0] * 4 + [1] * 4]
    batch.keep([])
    assert batch.starts == () and batch.mask is None


def test_rows_kept_in_order_stay_in_their_rooms_moved_down_over_those_that_left() -> None:
    """4 rows of 6, then 9, 3 and 12 positions (left-padded to 12 in one room); rows 1 and 3
    leave: rows 0 and 2 are moved down in the same rooms, no padding trimmed, and the next
    token is written in place."""
    batch = BatchCache()
    parts = [[states(1, n, 10 * n + layer) for layer in range(2)] for n in (6, 9, 3, 12)]
    batch.join(parts[0], torch.ones(1, 6, dtype=torch.long))
    batch.join([(torch.cat([F.pad(p[layer][0], (0, 0, 12 - p[layer][0].shape[2], 0))
                            for p in parts[1:]]),
                 torch.cat([F.pad(p[layer][1], (0, 0, 12 - p[layer][1].shape[2], 0))
                            for p in parts[1:]])) for layer in range(2)],
               torch.tensor([[0] * (12 - n) + [1] * n for n in (9, 3, 12)]))
    expected = [(k.clone(), v.clone()) for k, v in batch.kv]
    rooms = [layer.room[0].data_ptr() for layer in batch.cache.layers]
    batch.sequences = ["a", "b", "c", "d"]
    batch.keep([0, 2])
    assert batch.sequences == ["a", "c"] and batch.starts == (6, 9)
    assert batch.mask.tolist() == [[0] * 6 + [1] * 6, [0] * 9 + [1] * 3]
    assert [layer.room[0].data_ptr() for layer in batch.cache.layers] == rooms
    for (k, v), (k0, v0) in zip(batch.kv, expected, strict=True):
        assert torch.equal(k, k0[[0, 2]]) and torch.equal(v, v0[[0, 2]])
    layer = batch.cache.layers[0]
    k, v = states(2, 1, 99)
    got_k, _ = layer.update(k, v)
    assert layer.room[0].data_ptr() == rooms[0] and got_k.shape[:3] == (2, 2, 13)
    assert torch.equal(got_k[:, :, -1:], k)


def test_padding_no_row_needs_beyond_a_rooms_slack_is_dropped_by_a_rewrite() -> None:
    batch = BatchCache()
    batch.join([states(1, 4, 0)], torch.ones(1, 4, dtype=torch.long))
    batch.join([states(1, 80, 1)], torch.ones(1, 80, dtype=torch.long))
    room = batch.cache.layers[0].room[0].data_ptr()
    batch.sequences = ["short", "long"]
    batch.keep([0])  # 76 positions of padding: more than a room's 64 of slack
    assert batch.starts == (0,) and batch.mask.tolist() == [[1] * 4]
    assert batch.cache.layers[0].room[0].data_ptr() != room
    assert torch.equal(batch.kv[0][0], states(1, 4, 0)[0])
