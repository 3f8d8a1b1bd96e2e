"""A running batch's KV cache: rows join (left-padded to a common length) and leave.

Keys and values of every layer are [rows, heads, time, dim]; `mask` [rows, time] marks real
entries (1) and left padding (0). Position ids come from the mask, as in transformers' generate.

The resident batch's layers have room to grow (`RoomyLayer`): transformers' dynamic cache appends
each step's token by concatenation, a copy of the whole cache a step (at 1,000 positions x 4
rows of llama-160m on a 2-core host: 57 ms a decode step against 38 with room).

A worker keeps two batches: one with its cache on the worker's device, and one *offloaded*: its
cache lives in host memory and, on a GPU, each layer's keys and values are fetched to the device
just before that layer's attention and written back right after (transformers' offloading
cache, which prefetches the next layer on a side stream while this one computes).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from wire.call.device import synchronize

KV = list[tuple[torch.Tensor, torch.Tensor]]
HOST = torch.device("cpu")
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

    def keep_in_place(self, rows: list[int]) -> None:
        """Keep `rows` (ascending) where they are: each moved down over the rows that left."""
        width = self.keys.shape[2]
        for room in self.room:
            for new, old in enumerate(rows):
                if new != old:
                    room[new, :, :width] = room[old, :, :width]
        self.keys, self.values = (room[:len(rows), :, :width] for room in self.room)


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


def padded_bytes(lengths: list[int], token_bytes: int) -> int:
    """The most KV cache one batch of rows growing to `lengths` positions can come to: every
    row left-padded to the longest, in rooms."""
    return len(lengths) * room_positions(max(lengths)) * token_bytes


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


class BatchCache:
    def __init__(self, device: torch.device = HOST, offloaded: bool = False) -> None:
        self.device = device
        self.offloaded = offloaded
        self.cache = DynamicCache()
        self.mask: torch.Tensor | None = None
        self.starts: tuple[int, ...] = ()  # each row's leading padding positions
        self.sequences: list = []  # the engine's sequences, one per row, in row order

    @property
    def streams(self) -> bool:
        """Whether the cache moves layer by layer between host memory and the device."""
        return self.offloaded and self.device.type == "cuda"

    @property
    def kv(self) -> KV:
        kv = cache_tensors(self.cache)
        if self.streams:
            # after a step, the next step's first layer is on its way to the device (a side
            # stream) and the others on their way back to host memory (non-blocking copies):
            # both must land before the host reads them
            synchronize(self.device, self.cache.prefetch_stream)
            kv = [(k.to(HOST), v.to(HOST)) for k, v in kv]
        return kv

    @kv.setter
    def kv(self, kv: KV) -> None:
        if not kv:
            self.cache = DynamicCache()
        elif self.streams:
            self.cache = _offloading_cache([(k.to(HOST), v.to(HOST)) for k, v in kv], self.device)
        else:
            self.cache = RoomyCache(kv)

    @property
    def rows(self) -> int:
        return 0 if self.mask is None else self.mask.shape[0]

    def join(self, kv: KV, mask: torch.Tensor) -> None:
        """Append rows whose cache is `kv` and whose entries are marked by `mask` [n, time]."""
        if self.mask is None:
            self.kv, self.mask = kv, mask
            self.starts = _padding(mask)
            return
        width = max(self.mask.shape[1], mask.shape[1])
        if not self.streams:
            self.cache = RoomyCache.joined(self.kv, kv, width)
        else:
            self.kv = [(torch.cat([_pad(k0, width), _pad(k1.to(k0.device), width)]),
                        torch.cat([_pad(v0, width), _pad(v1.to(v0.device), width)]))
                       for (k0, v0), (k1, v1) in zip(self.kv, kv, strict=True)]
        self.mask = torch.cat([_pad_mask(self.mask, width), _pad_mask(mask, width)])
        self.starts = _padding(self.mask)

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (in this order). Rows kept in their order stay in their rooms, moved
        down over those that left (no new memory; the padding no row needs stays, which a
        decode step attending by rows does not read), unless that padding has come to more
        than a room's slack: then, as for rows in another order, the rows are written into new
        rooms without it."""
        self.sequences = [self.sequences[row] for row in rows]
        if not rows:
            self.kv, self.mask, self.starts = [], None, ()
            return
        index = torch.tensor(rows, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        starts = _padding(mask)
        start = min(starts)  # columns that are padding in every row
        if self._in_place(rows, start):
            for layer in self.cache.layers:
                layer.keep_in_place(rows)
            self.mask, self.starts = mask, starts
            return
        self.mask, self.starts = mask[:, start:], tuple(s - start for s in starts)
        if not self.streams:
            self.cache = RoomyCache.kept(self.kv, index, start)
        else:
            self.kv = [(k.index_select(0, index.to(k.device))[:, :, start:],
                        v.index_select(0, index.to(v.device))[:, :, start:]) for k, v in self.kv]

    def _in_place(self, rows: list[int], start: int) -> bool:
        width = self.mask.shape[1]
        return not self.streams and start <= room_positions(width) - width \
            and all(a < b for a, b in itertools.pairwise(rows)) \
            and all(isinstance(layer, RoomyLayer) and layer.room is not None
                    for layer in self.cache.layers)

    def step_inputs(self) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """(cache, attention mask, position ids) for one more token per row; the model's
        forward appends that token's keys and values to the cache in place."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.rows, 1)], dim=1)
        positions = self.mask.sum(1, keepdim=True) - 1
        return self.cache, self.mask, positions


def repeat_rows(kv: KV, n: int) -> KV:
    if n == 1:  # joining a batch copies the rows
        return kv
    return [(k.repeat(n, 1, 1, 1), v.repeat(n, 1, 1, 1)) for k, v in kv]


def _offloading_cache(host_kv: KV, device: torch.device) -> DynamicCache:
    """An offloading cache whose layers rest in host memory: each is fetched to `device` before
    its attention runs and goes back after; the first layer is fetched now."""
    cache = DynamicCache(ddp_cache_data=host_kv, offloading=True)
    for layer in cache.layers:
        layer.device = device  # where `prefetch` brings it; `offload` takes it back to the host
    cache.prefetch(0, cache.only_non_sliding)
    return cache


def _padding(mask: torch.Tensor) -> tuple[int, ...]:
    """Each row's leading positions that hold nothing."""
    return tuple((mask.cumsum(1) == 0).sum(1).tolist())


def _pad(t: torch.Tensor, width: int) -> torch.Tensor:
    return F.pad(t, (0, 0, width - t.shape[2], 0))


def _pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    return F.pad(mask, (width - mask.shape[1], 0))


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """Keys and values of one token across all layers (multi-head, grouped or multi-query)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * dtype.itemsize
