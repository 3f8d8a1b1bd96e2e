"""Cache layers with room to grow: a decode step writes its token in place.

transformers' dynamic cache appends each step's token by concatenation, a copy of the whole
cache a step (at 1,000 positions x 4 rows of llama-160m on a 2-core host: 57 ms a decode step
against 38 with room). A `RoomyLayer`'s keys and values are views of larger buffers (rooms);
rows can join a room's spare rows and leave it in place (`batch.BatchCache`).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KV = list[tuple[torch.Tensor, torch.Tensor]]
ROOM = 64  # positions a layer's room has beyond what it holds, at least (else a quarter more)


class RoomyLayer(DynamicLayer):
    """A dynamic cache layer whose keys and values are views of a larger buffer: a token appended
    is written into the room left, and only a full room is copied into a larger one. Keys or
    values set from outside (a batch's rows selected) are taken into a room of their own."""

    room: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        held = self.get_seq_length()
        need, rows = held + key_states.shape[-2], key_states.shape[0]
        room = self.room
        if room is None or room[0].shape[-2] < need or room[0].shape[0] < rows \
                or room[0].shape[1] != key_states.shape[1] \
                or not (_inside(self.keys, room[0]) and _inside(self.values, room[1])):
            room = self.room = (_larger(self.keys, key_states, held, need),
                                _larger(self.values, value_states, held, need))
        room[0][:rows, :, held:need] = key_states
        room[1][:rows, :, held:need] = value_states
        self.keys, self.values = room[0][:rows, :, :need], room[1][:rows, :, :need]
        return self.keys, self.values

    def join_in_place(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Rows no longer than the layer's, left-padded with zeros to it, into the room's spare
        rows (those left by rows kept in place)."""
        rows, width = self.keys.shape[0], self.keys.shape[2]
        for room, part in zip(self.room, (keys, values), strict=True):
            new = slice(rows, rows + part.shape[0])
            room[new, :, :width - part.shape[2]] = 0
            room[new, :, width - part.shape[2]:width] = part
        self.keys, self.values = (room[:rows + keys.shape[0], :, :width] for room in self.room)

    def keep_in_place(self, order: list[int]) -> None:
        """Keep the rows `order` names, in slots 0, 1, ... of the same room: each row moved
        into its slot (a row that stays where it is costs nothing)."""
        width = self.keys.shape[2]
        for room in self.room:
            for slot, row in enumerate(order):
                if slot != row:
                    room[slot, :, :width] = room[row, :, :width]
        self.keys, self.values = (room[:len(order), :, :width] for room in self.room)


class RoomyCache(DynamicCache):
    """A dynamic cache of `RoomyLayer`s, holding `kv` to begin with."""

    def __init__(self, kv: KV = ()) -> None:
        super().__init__()
        self.layer_class_to_replicate = RoomyLayer
        for keys, values in kv:
            layer = RoomyLayer()
            layer.update(keys, values)
            self.layers.append(layer)

    @classmethod
    def joined(cls, first: KV, second: KV, width: int) -> RoomyCache:
        """The rows of `first` then those of `second`, each left-padded with zeros to `width`,
        written once into rooms (not padded, concatenated, then copied into a room)."""
        cache = cls()
        cache.layers = [_holding(_stacked(k0, k1, width), _stacked(v0, v1, width), width)
                        for (k0, v0), (k1, v1) in zip(first, second, strict=True)]
        return cache

    @classmethod
    def kept(cls, kv: KV, index: torch.Tensor, start: int) -> RoomyCache:
        """The rows `index` of `kv` from position `start` on, written once into rooms."""
        cache = cls()
        width = kv[0][0].shape[2] - start if kv else 0
        cache.layers = [_holding(_selected(k, index, start), _selected(v, index, start), width)
                        for k, v in kv]
        return cache


def _holding(keys: torch.Tensor, values: torch.Tensor, width: int) -> RoomyLayer:
    """A layer whose rooms are `keys` and `values`, holding their first `width` positions."""
    layer = RoomyLayer()
    layer.lazy_initialization(keys, values)
    layer.room = (keys, values)
    layer.keys, layer.values = keys[:, :, :width], values[:, :, :width]
    return layer


def _inside(held: torch.Tensor, room: torch.Tensor) -> bool:
    return held.numel() == 0 or (held.data_ptr() == room.data_ptr()
                                 and held.stride() == room.stride())


def room_positions(width: int) -> int:
    """The positions of a room for `width`: room to grow beyond it."""
    return width + max(ROOM, width // 4)


def _room(like: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """An empty buffer of `rows` rows shaped as `like`'s, with room beyond `width` positions."""
    return like.new_empty((rows, like.shape[1], room_positions(width), like.shape[-1]))


def _stacked(first: torch.Tensor, second: torch.Tensor, width: int) -> torch.Tensor:
    room = _room(first, first.shape[0] + second.shape[0], width)
    for start, part in ((0, first), (first.shape[0], second.to(first.device))):
        rows, pad = slice(start, start + part.shape[0]), width - part.shape[2]
        room[rows, :, :pad] = 0
        room[rows, :, pad:width] = part
    return room


def _selected(held: torch.Tensor, index: torch.Tensor, start: int) -> torch.Tensor:
    width = held.shape[2] - start
    room = _room(held, len(index), width)
    torch.index_select(held[:, :, start:], 0, index.to(held.device), out=room[:, :, :width])
    return room


def _larger(held: torch.Tensor, new: torch.Tensor, count: int, need: int) -> torch.Tensor:
    room = _room(new, new.shape[0], need)
    if count:
        room[:, :, :count] = held
    return room


def cache_tensors(cache: DynamicCache) -> KV:
    return [(layer.keys, layer.values) for layer in cache.layers]
