"""A running batch's KV cache: rows join (left-padded to a common length) and leave.

Keys and values of every layer are [rows, heads, time, dim]; `mask` [rows, time] marks real
entries (1) and left padding (0). Position ids come from the mask, as in transformers' generate.

The resident batch's layers have room to grow (`rooms.py`): a token is written in place, rows
that leave leave the rooms in place, and rows no longer than the batch join its spare rows.

A worker keeps two batches: one with its cache on the worker's device, and one *offloaded*: its
cache lives in host memory and, on a GPU, each layer's keys and values are fetched to the device
just before that layer's attention and written back right after (transformers' offloading
cache, which prefetches the next layer on a side stream while this one computes).
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from wire.call.device import is_gpu, synchronize
from workers.inference.rooms import KV, RoomyCache, RoomyLayer, cache_tensors, room_positions

HOST = torch.device("cpu")
log = logging.getLogger("workers.batch")


def padded_bytes(lengths: list[int], token_bytes: int) -> int:
    """The most KV cache one batch of rows growing to `lengths` positions can come to: every
    row left-padded to the longest, in rooms."""
    return len(lengths) * room_positions(max(lengths)) * token_bytes


def place(request: Any, resident: BatchCache, offloaded: BatchCache, budget_bytes: int,
          token_bytes: int) -> BatchCache:
    """The resident batch while its cache, as large as it can grow with the request's rows in
    it, fits the device's KV budget (0: none); else the offloaded one."""
    if not budget_bytes:
        return resident
    rows = [*(s.request for s in resident.sequences), *[request] * request.params.n]
    need = padded_bytes([len(r.prompt_ids) + r.params.max_tokens for r in rows], token_bytes)
    if need <= budget_bytes:
        return resident
    log.info("request %s: the device's KV cache could come to %.1f MiB with it, over the "
             "budget of %.1f MiB: cache in host memory", request.id, need / 2**20,
             budget_bytes / 2**20)
    return offloaded


class BatchCache:
    def __init__(self, device: torch.device = HOST, offloaded: bool = False,
                 streams: bool | None = None) -> None:
        """`streams`: whether an offloaded cache moves layer by layer between host memory and
        the device (transformers' offloading cache: by default on a GPU only; the tests also
        drive it on the host, its CUDA streams stood in)."""
        self.device = device
        self.offloaded = offloaded
        self.streams = offloaded and (is_gpu(device) if streams is None else streams)
        self.cache = DynamicCache()
        self.mask: torch.Tensor | None = None
        self.starts: tuple[int, ...] = ()  # each row's leading padding positions
        self.sequences: list = []  # the engine's sequences, one per row, in row order

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
        if self._joins_in_place(mask):
            for layer, (keys, values) in zip(self.cache.layers, kv, strict=True):
                layer.join_in_place(keys.to(self.device), values.to(self.device))
        elif not self.streams:
            self.cache = RoomyCache.joined(self.kv, kv, width)
        else:
            self.kv = [(torch.cat([_pad(k0, width), _pad(k1.to(k0.device), width)]),
                        torch.cat([_pad(v0, width), _pad(v1.to(v0.device), width)]))
                       for (k0, v0), (k1, v1) in zip(self.kv, kv, strict=True)]
        self.mask = torch.cat([_pad_mask(self.mask, width), _pad_mask(mask, width)])
        self.starts = _padding(self.mask)

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows`, the engine's sequences with them. Rows given in ascending order
        stay in their rooms, in another order where that saves moves: a row past the new end
        fills the slot of one that left (no new memory; the padding no row needs stays, which a
        decode step attending by rows does not read), unless that padding has come to more
        than a room's slack. Otherwise the rows, in the order given, are written into new rooms
        without it."""
        if not rows:
            self.kv, self.mask, self.starts, self.sequences = [], None, (), []
            return
        start = min(self.starts[row] for row in rows)  # columns that are padding in every row
        in_place = self._kept_in_place(rows, start)
        if in_place:
            rows = _filled(rows)
            for layer in self.cache.layers:
                layer.keep_in_place(rows)
        self.sequences = [self.sequences[row] for row in rows]
        index = torch.tensor(rows, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        if in_place:
            self.mask, self.starts = mask, tuple(self.starts[row] for row in rows)
            return
        self.mask, self.starts = mask[:, start:], tuple(self.starts[row] - start for row in rows)
        if not self.streams:
            self.cache = RoomyCache.kept(self.kv, index, start)
        else:
            self.kv = [(k.index_select(0, index.to(k.device))[:, :, start:],
                        v.index_select(0, index.to(v.device))[:, :, start:]) for k, v in self.kv]

    def _joins_in_place(self, joining: torch.Tensor) -> bool:
        """Whether rows marked by `joining` fit the rooms' spare rows, no longer than the
        batch's width."""
        return self._roomy() and joining.shape[1] <= self.mask.shape[1] and all(
            layer.room[0].shape[0] >= self.rows + joining.shape[0] for layer in self.cache.layers)

    def _kept_in_place(self, rows: list[int], start: int) -> bool:
        width = self.mask.shape[1]
        return self._roomy() and start <= room_positions(width) - width \
            and all(a < b for a, b in itertools.pairwise(rows))

    def _roomy(self) -> bool:
        return not self.streams and all(isinstance(layer, RoomyLayer) and layer.room is not None
                                        for layer in self.cache.layers)

    def step_inputs(self) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """(cache, attention mask, position ids) for one more token per row; the model's
        forward appends that token's keys and values to the cache in place."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.rows, 1)], dim=1)
        positions = self.mask.sum(1, keepdim=True) - 1
        return self.cache, self.mask, positions


    def undo_step(self) -> None:
        """Take back the last `step_inputs` whose forward failed: its token in the mask and in
        every layer the forward reached."""
        width = self.mask.shape[1] - 1
        self.mask = self.mask[:, :width]
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, :width], layer.values[:, :, :width]


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


def _filled(rows: list[int]) -> list[int]:
    """Which of `rows` (ascending) each slot 0, 1, ... holds: a row stays in its slot, and those
    past the new end fill the slots of rows that left."""
    kept, past_end = set(rows), iter(row for row in rows if row >= len(rows))
    return [slot if slot in kept else next(past_end) for slot in range(len(rows))]


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
