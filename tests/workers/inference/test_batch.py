"""A running batch's cache: rows join left-padded and leave, in their rooms where they can, and
each row's padding is known."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.workers.inference.test_rooms import states
from workers.inference.batch import BatchCache


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


def test_a_row_past_the_new_end_fills_the_slot_of_one_that_left() -> None:
    """Of 4 rows, the first leaves: the last moves into its slot (one row copied, not three),
    the engine's sequences with it; the rooms stay."""
    batch = BatchCache()
    kv = [states(4, 6, layer) for layer in range(2)]
    batch.join(kv, torch.ones(4, 6, dtype=torch.long))
    rooms = [layer.room[0].data_ptr() for layer in batch.cache.layers]
    batch.sequences = ["a", "b", "c", "d"]
    batch.keep([1, 2, 3])
    assert batch.sequences == ["d", "b", "c"]
    assert [layer.room[0].data_ptr() for layer in batch.cache.layers] == rooms
    for (k, v), (k0, v0) in zip(batch.kv, kv, strict=True):
        assert torch.equal(k, k0[[3, 1, 2]]) and torch.equal(v, v0[[3, 1, 2]])


def test_rows_kept_in_order_stay_in_their_rooms_moved_down_over_those_that_left() -> None:
    """4 rows of 6, then 9, 3 and 12 positions (left-padded to 12 in one room); rows 1 and 3
    leave: rows 0 and 2 are moved down in the same rooms, no padding trimmed, and the next
    token is written in place."""
    batch = BatchCache()
    for n in (6, 9, 3, 12):
        batch.join([states(1, n, 10 * n + layer) for layer in range(2)],
                   torch.ones(1, n, dtype=torch.long))
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


def test_rows_join_the_rooms_spare_rows_in_place_when_no_longer_than_the_batch() -> None:
    """After 2 of 4 rows left in place, a row of 5 positions joins the 2 left (12 wide) in a
    spare row of the same rooms, left-padded with zeros; then one of 20 positions cannot."""
    batch = BatchCache()
    batch.join([states(4, 12, layer) for layer in range(2)], torch.ones(4, 12, dtype=torch.long))
    batch.sequences = ["a", "b", "c", "d"]
    batch.keep([1, 3])
    before = [(k.clone(), v.clone()) for k, v in batch.kv]
    rooms = [layer.room[0].data_ptr() for layer in batch.cache.layers]
    garbage = batch.cache.layers[0].room[0][2:]
    garbage.fill_(float("nan"))  # what the spare rows held: the padding is written over
    short = [states(1, 5, 10 + layer) for layer in range(2)]
    batch.join(short, torch.ones(1, 5, dtype=torch.long))
    assert [layer.room[0].data_ptr() for layer in batch.cache.layers] == rooms
    assert batch.starts == (0, 0, 7) and batch.mask.tolist()[2] == [0] * 7 + [1] * 5
    for (k, v), (k0, v0), (k1, v1) in zip(batch.kv, before, short, strict=True):
        assert torch.equal(k, torch.cat([k0, F.pad(k1, (0, 0, 7, 0))]))
        assert torch.equal(v, torch.cat([v0, F.pad(v1, (0, 0, 7, 0))]))
    batch.sequences.append("e")
    batch.join([states(1, 20, 20 + layer) for layer in range(2)],
               torch.ones(1, 20, dtype=torch.long))  # wider than the batch: new rooms
    assert batch.cache.layers[0].room[0].data_ptr() != rooms[0]
    assert batch.starts == (8, 8, 15, 0) and batch.kv[0][0].shape[:3] == (4, 2, 20)


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
