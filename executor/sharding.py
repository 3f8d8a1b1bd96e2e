"""The base layers split across the ranks of one torch.distributed group (tensor parallelism).

Every rank holds a slice of every base layer, so a model larger than one device fits:

- column-parallel (q/k/v, gate/up, the LM head, GPT-2's c_attn and c_fc): rank r holds rows
  `out_r` of W [out, in]; forward gathers [rows, out_r] pieces, backward sums the ranks'
  grad_y[:, out_r] W_r;
- row-parallel (o/down, GPT-2's c_proj): rank r holds columns `in_r`; forward sums the ranks'
  x[:, in_r] W_r^T (the bias added once), backward gathers grad_y W_r pieces;
- embeddings split by vocabulary: each rank looks up the ids in its range, zeros elsewhere, and
  the pieces are summed. An embedding that is not a plain table stays whole on rank 0.

Rank 0 runs the executor's server and compute loop unchanged: its runner for a layer broadcasts
a small header and the batch's rows to the other ranks, computes its own slice, and receives
the gathered or reduced result. The other ranks only follow (`follow`). A failed collective (a
rank died) marks the group broken: every later call fails at once and `on_broken` is called, so
the process can exit and be restarted as a whole.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from executor.columns import Columns
from executor.kernels import linear
from executor.pages import own_copy
from executor.registry import BaseLayer, LayerRegistry
from wire.call.messages import LayerKind, LayerSpec, Op

log = logging.getLogger("executor.sharding")

ROW_PARALLEL = ("o_proj", "down_proj", "c_proj", "out_proj", "fc2", "dense_4h_to_h", "wo")
STOP, BEAT = -1, -2
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32]
HEADER = 5  # layer, op, rows, width (0: a vector of ids), dtype


class ShardsBroken(RuntimeError):
    pass


@dataclass
class Shard:
    spec: LayerSpec
    mode: str  # column | row | vocab | whole
    weight: torch.Tensor  # this rank's slice
    bias: torch.Tensor | None
    sizes: list[int]  # every rank's share of the split dimension
    start: int  # this rank's offset in it
    embedding: nn.Module | None = None  # mode whole (rank 0)

    @property
    def size(self) -> int:
        return self.weight.shape[0] if self.mode in ("column", "vocab") else self.weight.shape[1]


def split_sizes(n: int, world: int) -> list[int]:
    base, extra = divmod(n, world)
    return [base + (r < extra) for r in range(world)]


def shard_layer(layer: BaseLayer, rank: int, world: int, device: torch.device,
                huge_pages: bool = True) -> Shard:
    spec = layer.spec
    if spec.kind not in (LayerKind.LINEAR, LayerKind.EMBEDDING):
        raise ValueError(f"{spec.name}: only linear layers and embeddings are sharded "
                         "(start the executor without fusion and stretches)")
    if spec.kind == LayerKind.EMBEDDING:
        module = layer.embedding
        if type(module) is not nn.Embedding or module.max_norm is not None:
            keep = rank == 0
            return Shard(spec, "whole", layer.weight if keep else layer.weight.new_empty(0), None,
                         [], 0, module.to(device) if keep else None)
        sizes = split_sizes(spec.in_features, world)  # in_features: the vocabulary
        start = sum(sizes[:rank])
        weight = own_copy(layer.weight[start:start + sizes[rank]].to(device), huge_pages)
        return Shard(spec, "vocab", weight, None, sizes, start)
    row = spec.name.rsplit(".", 1)[-1] in ROW_PARALLEL
    sizes = split_sizes(spec.in_features if row else spec.out_features, world)
    start, stop = sum(sizes[:rank]), sum(sizes[:rank + 1])
    if row:
        weight = layer.weight[:, start:stop]
        bias = layer.bias if rank == 0 else None  # added once, by rank 0
    else:
        weight = layer.weight[start:stop]
        bias = None if layer.bias is None else layer.bias[start:stop]
    return Shard(spec, "row" if row else "column", own_copy(weight.to(device), huge_pages),
                 None if bias is None else bias.to(device).clone(), sizes, start)


def shard_registry(registry: LayerRegistry, rank: int, world: int, device: torch.device,
                   huge_pages: bool = True) -> list[Shard]:
    shards = [shard_layer(layer, rank, world, device, huge_pages) for layer in registry.layers]
    registry.layers.clear()  # the whole weights go; only this rank's slices stay
    registry.by_name.clear()
    return shards


def compute(shard: Shard, op: Op, x: torch.Tensor, rank: int) -> torch.Tensor | None:
    """This rank's part of one call, combined on rank 0 (the result there; None elsewhere)."""
    if shard.mode == "vocab":
        local = x - shard.start
        inside = (local >= 0) & (local < shard.size)
        rows = F.embedding(local.clamp(0, shard.size - 1), shard.weight)
        rows = rows * inside.unsqueeze(-1).to(rows.dtype)
        dist.reduce(rows, 0)
        return rows if rank == 0 else None
    forward = op in (Op.FORWARD, Op.FORWARD_NOBIAS)
    bias = shard.bias if op == Op.FORWARD else None
    part = slice(shard.start, shard.start + shard.size)
    if shard.mode == "column":
        if forward:
            return _gather(linear(x, shard.weight, bias), shard.sizes, rank)
        return _reduce(linear(x[:, part].contiguous(), shard.weight.t()), rank)
    if forward:
        return _reduce(linear(x[:, part].contiguous(), shard.weight, bias), rank)
    return _gather(linear(x, shard.weight.t()), shard.sizes, rank)


def _reduce(y: torch.Tensor, rank: int) -> torch.Tensor | None:
    y = y.contiguous()
    dist.reduce(y, 0)
    return y if rank == 0 else None


def _gather(y: torch.Tensor, sizes: list[int], rank: int) -> torch.Tensor | None:
    """Pieces [rows, sizes[r]] of every rank, side by side on rank 0 (padded on the way: the
    collective needs one shape)."""
    widest = max(sizes)
    piece = F.pad(y, (0, widest - y.shape[1])).contiguous()
    pieces = [torch.empty_like(piece) for _ in sizes] if rank == 0 else None
    dist.gather(piece, pieces, dst=0)
    if rank != 0:
        return None
    return torch.cat([p[:, :size] for p, size in zip(pieces, sizes, strict=True)], dim=1)


def follow(shards: list[Shard], rank: int, device: torch.device) -> None:
    """Ranks other than 0: run each call rank 0 announces, until it says stop."""
    header = torch.empty(HEADER, dtype=torch.int64, device=device)
    while True:
        dist.broadcast(header, 0)
        layer, op, rows, width, code = header.tolist()
        if layer == STOP:
            return
        if layer == BEAT:
            continue
        x = torch.empty((rows, width) if width else (rows,), dtype=DTYPES[code], device=device)
        dist.broadcast(x, 0)
        compute(shards[layer], Op(op), x, rank)


class Leader:
    """Rank 0's side: the runners the compute loop calls, each driving the whole group."""

    def __init__(self, shards: list[Shard], device: torch.device,
                 on_broken: Callable[[], None] = lambda: None) -> None:
        self.shards = shards
        self.device = device
        self.on_broken = on_broken
        self.broken = False
        self.lock = threading.Lock()  # one collective sequence at a time
        self.last = time.monotonic()

    def run(self, index: int, op: Op, x: torch.Tensor) -> torch.Tensor:
        shard = self.shards[index]
        if shard.mode == "whole":
            return shard.embedding(x)
        if x.shape[0] == 0:
            return shard.weight.new_zeros((0, _width(shard.spec, op)))
        header = [index, int(op), x.shape[0], x.shape[1] if x.dim() > 1 else 0,
                  DTYPES.index(x.dtype)]
        with self.lock:
            return self._collective(lambda: self._call(shard, op, header, x))

    def _call(self, shard: Shard, op: Op, header: list[int], x: torch.Tensor) -> torch.Tensor:
        self._announce(header)
        x = x.contiguous()
        dist.broadcast(x, 0)
        return compute(shard, op, x, 0)

    def beat(self, idle_s: float) -> None:
        """Tell the other ranks rank 0 is alive if nothing else did for `idle_s` (their wait
        for the next call would time out otherwise)."""
        with self.lock:
            if not self.broken and time.monotonic() - self.last >= idle_s:
                self._collective(lambda: self._announce([BEAT, 0, 0, 0, 0]))

    def stop(self) -> None:
        with self.lock:
            if not self.broken:
                self._collective(lambda: self._announce([STOP, 0, 0, 0, 0]))

    def _announce(self, header: list[int]) -> None:
        dist.broadcast(torch.tensor(header, dtype=torch.int64, device=self.device), 0)
        self.last = time.monotonic()

    def _collective(self, work: Callable[[], torch.Tensor | None]) -> torch.Tensor | None:
        if self.broken:
            raise ShardsBroken("a rank of the executor's group is down")
        try:
            return work()
        except RuntimeError as exc:  # a collective failed: some rank is gone
            self.broken = True
            log.error("the executor's group broke: %s", exc)
            self.on_broken()
            # the collective's own message (with its library's source paths) stays in this log
            raise ShardsBroken("a rank of the executor's group is down") from None


def _width(spec: LayerSpec, op: Op) -> int:
    if spec.kind == LayerKind.EMBEDDING:
        return spec.out_features
    return spec.in_features if op == Op.BACKWARD else spec.out_features


class ShardedRegistry(LayerRegistry):
    """What the server sees on rank 0: every layer's spec, this rank's slices, and runners
    that drive the group."""

    def __init__(self, shards: list[Shard], leader: Leader, model_name: str,
                 dtype: torch.dtype) -> None:
        super().__init__([BaseLayer(s.spec, s.weight, s.bias, s.embedding) for s in shards],
                         model_name, dtype)
        self.leader = leader

    def runners(self) -> list[dict[int, Callable[[torch.Tensor], torch.Tensor]]]:
        table = []
        for layer in self.layers:
            ops = [Op.FORWARD] if layer.spec.kind == LayerKind.EMBEDDING else list(Op)
            table.append({op: (lambda x, i=layer.spec.index, o=op: self.leader.run(i, o, x))
                          for op in ops})
        return table

    def columns(self) -> list[dict[int, Columns]]:
        return [{} for _ in self.layers]  # an op drives the whole group: sliced by rows

    def run(self, op: Op, layer: BaseLayer, x: torch.Tensor) -> torch.Tensor:
        return self.leader.run(layer.spec.index, op, x)
